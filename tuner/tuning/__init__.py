"""Tuning: what each class of requests is served, learned from the traffic itself.

One subpackage per concept, each depending only on those listed before it:

- ``variants``, ``config``: the speculative settings a server can run, and the tuning file;
- ``policy``: a class's policy and the guard that chooses it, and the speedup model as a prior;
- ``evidence``: per class and variant, the counts served and replayed, and drift;
- ``pricing``: speedups from counts, a drafted token's cost, the fitted plain step;
- ``search``: the trial search over a class's Optuna study;
- ``replay``: answered requests replayed through the n-gram drafters;
- ``runtime``: the engine, its rules, the daemon service, quarantine and the policy file.
"""
