"""The trial search: which variant a class tries next, over its Optuna study."""
