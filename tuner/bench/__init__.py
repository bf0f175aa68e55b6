"""``tuner bench``: workload replay against baseline, a static-variant matrix and the tuner."""
