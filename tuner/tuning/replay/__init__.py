"""Answered requests replayed through the n-gram drafters: evidence for variants not served."""
