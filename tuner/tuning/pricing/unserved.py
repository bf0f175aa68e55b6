"""How far the price of a variant that has not served may lie from its time. Pure.

A variant that has not served in a class is priced by its replayed drafts at the cost the
served variants' requests set (``Calibration.costs``): their cost at its draft length,
over all traffic, not its own in the class. How far that lands from what its own requests
would say is measured on the variants that have served: each one's price at the cost it
would have had unserved (``blind``) against its price at its own cost in the class. A
held variant's rival inside that error is unresolved until serving it measures its cost
(``tuner.tuning.policy.rivals``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tuner.tuning.evidence.counts import MIN_REL

__all__ = ["DEFAULT_ERROR", "MIN_OBSERVATIONS", "MIN_SERVED", "log_error", "spread"]

MIN_SERVED = 8  # a variant's served requests in a class before it measures the error there
MIN_OBSERVATIONS = 2  # served variants a level needs before its own error is used
# the log error before any is measured: #69's held-out run priced variants 0.84-1.10 of
# their time, with a root mean square of about 0.09 in log
DEFAULT_ERROR = 0.10


def log_error(blind: float, own: float) -> float:
    """One served variant's pricing error: the log of its price at the cost it would
    have had unserved over its price at its own cost.

    >>> round(log_error(1.229, 1.459), 3)
    -0.172
    """
    return math.log(blind / own)


def spread(errors: Sequence[float]) -> float:
    """The pricing error of an unserved variant, in log terms: the root mean square of
    the served variants' errors (a bias counts as much as a scatter), at least the model
    error every interval carries; ``DEFAULT_ERROR`` before ``MIN_OBSERVATIONS`` of them.

    >>> round(spread([-0.17, -0.09, 0.05]), 3)
    0.115
    >>> spread([0.0, 0.0]), spread([0.3])
    (0.01, 0.1)
    """
    if len(errors) < MIN_OBSERVATIONS:
        return DEFAULT_ERROR
    return max(MIN_REL, math.sqrt(math.fsum(e * e for e in errors) / len(errors)))
