"""A class's policy, the guard that chooses it, and the speedup model as a prior. Pure."""
