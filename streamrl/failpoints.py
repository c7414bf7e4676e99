"""Fault injection for the chaos lane: named points in a role's code where, when the
environment asks, the role wedges as a stuck forward would (its main thread sleeps with the
GIL released, so its heartbeat thread goes on). Inert unless ``STREAMRL_FAILPOINT`` is set;
the product never sets it.

``STREAMRL_FAILPOINT="<point>:<incarnation>:<n>"``: the ``n``-th hit of ``<point>`` in a
process of that incarnation hangs for good (a restarted role, the next incarnation, runs
clean). Points: ``reward_role.score`` (a reward role's scoring batch).

Example: ``STREAMRL_FAILPOINT=reward_role.score:0:3`` wedges reward role incarnation 0 in its
third batch; the supervisor sees no progress for ``run.stall_timeout_s`` and restarts it.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter

log = logging.getLogger(__name__)

ENV = "STREAMRL_FAILPOINT"
_hits: Counter[str] = Counter()


def hit(point: str, incarnation: int) -> None:
    """Pass ``point`` (module doc): returns at once unless the environment names it."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, wanted, nth = spec.rsplit(":", 2)
    if name != point or int(wanted) != incarnation:
        return
    _hits[point] += 1
    if _hits[point] == int(nth):
        log.warning("failpoint %s: hanging (incarnation %d, hit %s)", point, incarnation, nth)
        while True:
            time.sleep(3600)
