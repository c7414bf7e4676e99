"""``buffer.max_staleness: auto``: the controller tunes the staleness bound while the run goes
on (docs/design.md §3).

The right bound depends on the machine and the job: the smallest one at which the learner
does not wait for batches trains on the freshest data at full speed. Every
``staleness_tuning.window`` learner steps the tuner reads the window's step records and
decides, one step of the bound at a time, within ``[min, max]``:

- **guard** (first): the trained tokens' importance weights say the generator's policy was
  too far from the learner's because of the bound: ESS fraction below ``GUARD_ESS``, or the
  KL the bound adds above ``GUARD_K3``: lower the bound; no raise while it holds, nor back to
  the bound it left for four windows. The KL (k3 of KL(behaviour || learner), by versions of
  lag: ``drift/k3_lag*``) is split in two: what one version of lag carries, which is how far
  the learning rate moves the policy in a step and which every asynchronous run has, and
  what the tokens two or more versions behind carry on top, which a bound above 1 adds. Only
  the second is the bound's (at a bound of 1, the first is: over a synchronous run). Early in
  the default job (EPYC, seed 0) a window at bound 2 had 0.0375 at one version and 0.0677 at
  two: the whole, 0.0526, tripped the old guard, while the bound added 0.030. Where a window
  has no figures by lag, the whole KL is read, as before.
- **raise**: the learner waited for batches (``time/wait_batch_s``) at least
  ``RAISE_WHEN_LEARNER_WAITS`` of the window, while the generators were held back by the bound
  (waiting for admission or for the weights a grant needs) at least ``RAISE_WHEN_HELD`` of
  theirs and generated a batch in no more time than the learner trained one: the bound, not
  generation speed, is what the learner waits on.
- **lower**: the learner waited less than ``LOWER_WHEN_LEARNER_WAITS``: it sets the pace, and
  a smaller bound makes the data fresher at no cost as long as generation still overlaps
  training: a batch's generation time plus a version's way to the generators (publish ->
  applied, the window's median) at most ``LOWER_MARGIN`` of the smaller bound's worth of
  training time. A generator can start on the batch a version allows only once that version
  is applied, so at a bound of 1 with a 1 s step, 0.7 s of generation and 0.5 s of latency it
  would wait for weights every cycle. Never to 0 for pace (that is synchronous: no overlap);
  only the guard goes there. A lower step the next window undoes
  (the learner started waiting) is not tried again for four windows.

A decision goes through the same live path as an admin ``PATCH /config`` (admission, shards,
learners) and into the audit trail (``audit.jsonl``, client ``staleness-tuner``, with its
reason and figures) and the metrics log (``staleness_tuned`` events). A change made by the
admin is the tuner's new starting point: it decides again a window later.

Example: window 5, bound 1; steps 6-10 the learner waited 30% and the generators were held
12%: the bound goes to 2. Steps 11-15 the learner waited 0.5%: back to 1; steps 16-20 it waits
20% again: 2, and 1 is not tried before step 40.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from streamrl.config import StalenessTuning

log = logging.getLogger(__name__)

RETRY_WINDOWS = 4  # windows before a lower step that was undone is tried again
LOWER_MARGIN = 0.8  # generation time per batch at most this share of the lower bound's training
# The decisions' thresholds (module doc): shares of a window's time, and the quality guard's
# limits on the trained tokens' importance weights. Constants: no job has needed others.
RAISE_WHEN_LEARNER_WAITS = 0.05
RAISE_WHEN_HELD = 0.05
LOWER_WHEN_LEARNER_WAITS = 0.01
GUARD_ESS = 0.8  # effective sample size fraction below this: too far off-policy
GUARD_K3 = 0.05  # KL(behaviour || proximal) (k3) above this: too far off-policy


@dataclass
class Decision:
    old: int
    new: int
    reason: str
    figures: dict[str, float]


@dataclass
class WindowFigures:
    """What one window of step records says (module doc)."""

    learner_wait: float  # share of the window's wall time the learner waited for a batch
    generators_held: float  # share of generator time waiting for admission or weights
    # Generation time per trained batch over training time per batch (the generators' busy
    # seconds over the learner's): the bound that lets them overlap is about its ceiling.
    gen_over_train: float | None
    # Publish -> applied (the slowest generator's, median over the window) over training time
    # per batch: how much of a bound's overlap a version's way to the generators uses up.
    latency_over_train: float | None
    ess: float | None  # mean policy/is_ess over the steps that report it
    k3: float | None  # mean policy/offpolicy_k3
    # KL(behaviour || learner) of the tokens sampled one version behind (how far a version
    # moves the policy: the learning rate's doing) and two or more behind (what a bound above
    # 1 adds); means of drift/k3_lag*.
    drift_lag1: float | None = None
    drift_lag2plus: float | None = None

    @classmethod
    def of(cls, records: list[dict[str, Any]], before: dict[str, Any]) -> WindowFigures:
        waited = sum(r.get("time/wait_batch_s", 0.0) for r in records)
        trained = sum(r.get("time/busy_s", r.get("time/step_s", 0.0)) for r in records)
        last = records[-1]
        span = last["time"] - before["time"]
        n_gen = max(int(last.get("generators/count", 1)), 1)

        def delta(key: str) -> float:
            return float(last.get(key, 0.0)) - float(before.get(key, 0.0))

        held = delta("generators/wait_admission_s_total") + delta("generators/wait_weights_s_total")
        generating = delta("generators/busy_s_total") / n_gen

        def mean(key: str) -> float | None:
            values = [r[key] for r in records if r.get(key) is not None]
            return sum(values) / len(values) if values else None

        latencies = sorted(
            r["weights/publish_to_applied_s_max"]
            for r in records
            if r.get("weights/publish_to_applied_s_max")
        )
        per_batch = trained / len(records)
        latency = latencies[len(latencies) // 2] if latencies else None

        return cls(
            learner_wait=min(waited / span, 1.0) if span > 0 else 0.0,
            generators_held=held / (span * n_gen) if span > 0 else 0.0,
            gen_over_train=generating / trained if trained > 0 and generating > 0 else None,
            latency_over_train=latency / per_batch if latency and per_batch > 0 else None,
            ess=mean("policy/is_ess"),
            k3=mean("policy/offpolicy_k3"),
            drift_lag1=mean("drift/k3_lag1"),
            drift_lag2plus=_max_or_none(mean("drift/k3_lag2"), mean("drift/k3_lag3plus")),
        )

    def drift_added_by(self, bound: int) -> float | None:
        """The KL the bound itself adds: at a bound above 1, the tokens two or more versions
        behind over those one behind (what any asynchronous run carries: how far the learning
        rate moves the policy in a version); at 1, the one-version drift itself (over a
        synchronous run). None where the window has no such tokens to compare."""
        if bound <= 1:
            return self.drift_lag1
        if self.drift_lag2plus is None or self.drift_lag1 is None:
            return None
        return max(self.drift_lag2plus - self.drift_lag1, 0.0)

    def as_dict(self) -> dict[str, float]:
        out = {"learner_wait": self.learner_wait, "generators_held": self.generators_held}
        if self.gen_over_train is not None:
            out["gen_over_train"] = self.gen_over_train
        if self.latency_over_train is not None:
            out["latency_over_train"] = self.latency_over_train
        if self.ess is not None:
            out["ess"] = self.ess
        if self.k3 is not None:
            out["offpolicy_k3"] = self.k3
        if self.drift_lag1 is not None:
            out["drift_k3_lag1"] = self.drift_lag1
        if self.drift_lag2plus is not None:
            out["drift_k3_lag2plus"] = self.drift_lag2plus
        return out


def _max_or_none(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


@dataclass
class StalenessTuner:
    tuning: StalenessTuning
    records: list[dict[str, Any]] = field(default_factory=list)
    before: dict[str, Any] | None = None  # the record that opens the window
    bound_seen: int | None = None  # the bound the window ran under
    # Bounds not to move to for a while (-> windows left): one a guard lowered from, one a
    # lower step went to and the next window undid.
    blocked: dict[int, int] = field(default_factory=dict)
    last_lowered_from: int | None = None  # the previous decision, if it lowered

    def observe(self, record: dict[str, Any], bound: int) -> Decision | None:
        """One learner step's record, under the bound in force; a decision at the end of a
        window (None: keep the bound)."""
        if self.bound_seen != bound or self.before is None:
            # The first record, or someone else changed the bound: a fresh window from here.
            self.bound_seen, self.before, self.records = bound, record, []
            return None
        self.records.append(record)
        if len(self.records) < self.tuning.window:
            return None
        figures = WindowFigures.of(self.records, self.before)
        self.before, self.records = record, []
        decision = self._decide(figures, bound)
        for key in list(self.blocked):
            self.blocked[key] -= 1
            if self.blocked[key] <= 0:
                del self.blocked[key]
        if decision is not None:
            if self.last_lowered_from == decision.new and decision.new > decision.old:
                self.blocked[decision.old] = RETRY_WINDOWS  # that lower step hurt: not soon
            if decision.reason.startswith("quality guard"):
                self.blocked[decision.old] = RETRY_WINDOWS  # nor back up to what it left
            self.last_lowered_from = decision.old if decision.new < decision.old else None
            self.bound_seen = decision.new
        else:
            self.last_lowered_from = None
        return decision

    def _decide(self, f: WindowFigures, bound: int) -> Decision | None:
        t = self.tuning
        figures = f.as_dict()
        guard = []
        if f.ess is not None and f.ess < GUARD_ESS:
            guard.append(f"importance-weight ESS {f.ess:.3f} < {GUARD_ESS}")
        added = f.drift_added_by(bound)
        if added is not None and added > GUARD_K3:
            guard.append(f"KL the bound adds {added:.4f} > {GUARD_K3}")
        elif added is None and f.k3 is not None and f.k3 > GUARD_K3:
            guard.append(f"KL(behaviour || proximal) {f.k3:.4f} > {GUARD_K3}")
        elif f.k3 is not None and f.k3 > GUARD_K3:
            log.info(
                "staleness bound %d kept: KL(behaviour || proximal) %.4f > %s, but one version "
                "of lag already carries %.4f (the learning rate's drift, not the bound's)",
                bound,
                f.k3,
                GUARD_K3,
                f.drift_lag1 or 0.0,
            )
        if guard:
            if bound > t.min:
                return Decision(bound, bound - 1, "quality guard: " + ", ".join(guard), figures)
            return None
        waits = f"learner waited {f.learner_wait:.1%}, generators held {f.generators_held:.1%}"
        if (
            f.learner_wait >= RAISE_WHEN_LEARNER_WAITS
            and f.generators_held >= RAISE_WHEN_HELD
            and (f.gen_over_train is None or f.gen_over_train <= 1.0)
            and bound < t.max
            and bound + 1 not in self.blocked
        ):
            return Decision(bound, bound + 1, f"raise: {waits}", figures)
        # Lower only where generation would still overlap training (its time per batch plus
        # a version's publish -> applied at most the smaller bound's worth of training, with
        # a margin), and never to 0 for pace (synchronous: no overlap at all); only the guard
        # goes there.
        lower = bound - 1
        if f.gen_over_train is None:
            return None
        needed = f.gen_over_train + (f.latency_over_train or 0.0)
        overlaps = needed <= LOWER_MARGIN * lower
        if f.learner_wait < LOWER_WHEN_LEARNER_WAITS and lower >= max(t.min, 1) and overlaps:
            if lower not in self.blocked:
                why = f"(gen + latency)/train {needed:.2f}"
                return Decision(bound, lower, f"lower: {waits}, {why}", figures)
        return None
