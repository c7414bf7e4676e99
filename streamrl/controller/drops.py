"""Say so when every group is being dropped: a run that accepts nothing stalls silently.

A reward plugin that raises scores every sample 0, so with ``drop_zero_variance`` every group
is dropped; a poisoned generator's groups are all refused at the door. The learners then wait
for data that never comes. ``DropWatch`` reads the shards' running totals and returns one
console line when, for ``window_s``, groups kept arriving and none was accepted, naming the
reason most of them were dropped for (and the reward errors, when there are any).

Example::

    watch = DropWatch(window_s=30)
    watch.observe(0.0, accepted=10, dropped={"zero_variance": 4}, reward_errors=0)   # None
    watch.observe(31.0, accepted=10, dropped={"zero_variance": 60}, reward_errors=56)
    # "no group accepted in 31 s: 56 of 56 dropped as zero_variance (reward errors: 56 ...)"
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from streamrl.controller.state import shard_drops


class DropWatch:
    def __init__(self, window_s: float = 60.0, min_dropped: int = 8) -> None:
        self.window_s, self.min_dropped = window_s, min_dropped
        self._samples: deque[tuple[float, int, dict[str, int], int]] = deque()
        self._said_at = float("-inf")

    def observe(
        self, now: float, *, accepted: int, dropped: dict[str, int], reward_errors: int
    ) -> str | None:
        """Take the totals at ``now``; a line to print (at most once per window), or None."""
        self._samples.append((now, accepted, dict(dropped), reward_errors))
        while len(self._samples) > 1 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()
        start, accepted0, dropped0, errors0 = self._samples[0]
        if now - start < self.window_s or now - self._said_at < self.window_s:
            return None
        if accepted > accepted0:
            return None
        delta = {why: n - dropped0.get(why, 0) for why, n in dropped.items()}
        total = sum(n for n in delta.values() if n > 0)
        if total < self.min_dropped:
            return None
        why, most = max(delta.items(), key=lambda item: item[1])
        self._said_at = now
        line = f"no group accepted in {now - start:.0f} s: {most} of {total} dropped as {why}"
        errors = reward_errors - errors0
        if errors:
            line += f" (reward errors: {errors}; see the generators' logs)"
        return line

    def observe_state(self, now: float, state: Any) -> str | None:
        """``observe`` with the totals of a ``RunState``: what the shards accepted and dropped
        (from their durable logs when they have them: those count over restarts), refusals at
        the door by reason, and the generators' reward errors and timeouts."""
        dropped: Counter[str] = Counter()
        accepted = 0
        with state.lock:
            shards = list(state.shards.values())
            reports = state.all_generator_reports()
            errors = sum(g.reward_errors + g.reward_timeouts for g in reports)
        for s in shards:
            by_reason = shard_drops(s)
            accepted += (s.received_total or s.ingested) - sum(by_reason.values())
            by_reason.pop("invalid", None)  # said by reason instead
            dropped.update(by_reason)
            dropped.update({f"invalid ({k})": n for k, n in s.invalid.items()})
        return self.observe(now, accepted=accepted, dropped=dict(dropped), reward_errors=errors)
