"""``tuner report``: what the daemon decided per class, and why (table, JSON, markdown, plot)."""
