"""Model facts (GGUF introspection) and the speedup maths. No IO beyond reading a file."""
