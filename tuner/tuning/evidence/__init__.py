"""What the engine knows per class and variant: counts served and replayed, and drift."""
