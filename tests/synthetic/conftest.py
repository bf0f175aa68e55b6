"""The model writers' tests share the model tests' tokenizer fixture."""

from tests.model.conftest import vocab

__all__ = ["vocab"]
