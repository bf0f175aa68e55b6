"""Everything about llama-server: which engine, obtaining it, its capabilities, running it,
talking to it."""
