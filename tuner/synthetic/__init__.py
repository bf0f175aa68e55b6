"""GGUF models written here: targets of a chosen width from random weights (a 35B-A3B-wide
MoE, a recurrent hybrid; ``tuner synth-moe``, the verify-cost benchmarks, the tests), and a
same-vocabulary draft cut from a target's own blocks (``tuner derive-draft``). They write
files; ``tuner.model`` only reads them."""
