"""The options' ranges, in one table: checked where a SpecConfig or RunConfig is made, and by the
CLI before torch loads, so a number out of range is refused at once, in one line."""
from __future__ import annotations

import math

from spectrace.errors import SpectraceError

# option -> (its flag, what it must be, the test); nan fails every comparison
RANGES = {
    "max_new_tokens": ("--max-new-tokens", "must be at least 1", lambda v: v >= 1),
    "num_steps": ("--num-steps", "must be at least 1", lambda v: v >= 1),
    "topk": ("--topk", "must be at least 1", lambda v: v >= 1),
    "top_p": ("--top-p", "must lie in (0, 1]", lambda v: 0 < v <= 1),
    "temperature": ("--temperature", "must be a finite number >= 0", lambda v: 0 <= v < math.inf),
    "threshold_single": ("--speculative-accept-threshold-single", "must lie in [0, 1]",
                         lambda v: 0 <= v <= 1),
    "threshold_acc": ("--speculative-accept-threshold-acc", "must lie in [0, 1]",
                      lambda v: 0 <= v <= 1),
    "seed": ("--seed", "must lie in [0, 2**32)", lambda v: 0 <= v < 2 ** 32),
    "top_k": ("--top-k", "must be a count, or 0 or -1 for off (the peers' spelling)",
              lambda v: v >= -1),
    "batch": ("--batch", "must be at least 1", lambda v: v >= 1),
    "mem_fraction_static": ("--mem-fraction-static", "must lie in (0, 1]", lambda v: 0 < v <= 1),
}


def check_ranges(**values) -> None:
    """Each option given (None: unset) within its range, else one line naming its flag."""
    for name, value in values.items():
        flag, what, ok = RANGES[name]
        if value is not None and not ok(value):
            raise SpectraceError(f"{flag} {what}, got {value}")
