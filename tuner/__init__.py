"""spec-tuner: speculative decoding for llama-server, on where it pays and off where it does not."""

__version__ = "0.2.0"

__all__ = ["__version__"]
