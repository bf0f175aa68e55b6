"""Speedups from counts: what a drafted token costs, and the plain step it is priced in."""
