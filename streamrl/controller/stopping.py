"""When a run ends before ``run.max_steps`` because nothing is left to learn.

Two rules, each off unless configured, each giving a one-line reason; the controller then
stops the run as a graceful stop does (the current step finishes, a checkpoint is saved, the
final weights are evaluated and exported) and writes the reason to the console, a ``stop``
event in ``metrics.jsonl`` and ``summary.json`` (``stopped_because``):

- **patience** (``eval.patience``): that many evaluations in a row without a gain of more than
  ``eval.min_delta`` in ``eval.patience_metric`` over the best so far (the PPO guides' "three
  evaluations without improvement"). The before-training evaluation sets the first best.
- **over-optimisation** (``eval.stop_below_best``): ``eval.patience_metric`` has fallen more
  than that below the best it reached. A run against a learned reward (a reward model, a
  judge) can climb its reward while the held-out rule check falls; this rule ends it, and
  ``summary.json`` names the best version (``records.best_evaluation``).
- **starvation** (``run.stop_when_starved_s``): for that long groups kept coming and every one
  was dropped (``drops.DropWatch``): typically every group zero-variance under dynamic
  sampling once every training prompt is solved, so the learner would wait for ever.

Example::

    rules = StopRules(patience=2, metric="eval/completed", min_delta=0.0, starved_s=0)
    rules.evaluated({"eval/completed": 0.5})   # None: the first best
    rules.evaluated({"eval/completed": 0.5})   # None: 1 without a gain
    rules.evaluated({"eval/completed": 0.4})   # "no gain in eval/completed over 2 evaluations ..."

    rules = StopRules(0, "eval/exact_match", 0.0, 0, below_best=0.1)
    rules.evaluated({"eval/exact_match": 0.25})  # None
    rules.evaluated({"eval/exact_match": 0.10})  # "eval/exact_match 0.100 is 0.150 below ..."
"""

from __future__ import annotations

from typing import Any

from streamrl.controller.drops import DropWatch


class StopRules:
    def __init__(
        self,
        patience: int,
        metric: str,
        min_delta: float,
        starved_s: float,
        below_best: float = 0.0,
    ) -> None:
        self.patience, self.metric, self.min_delta = patience, metric, min_delta
        self.below_best = below_best
        self.best: float | None = None  # patience's: raised only by a gain above min_delta
        self.peak: float | None = None  # the highest value seen
        self.without_gain = 0
        # Any drop counts: once nothing is accepted for the window, the run is starved.
        self.drops = DropWatch(window_s=starved_s, min_dropped=1) if starved_s > 0 else None

    def evaluated(self, metrics: dict[str, float]) -> str | None:
        """Take one evaluation's figures; the reason to stop, or None."""
        if self.metric not in metrics:
            return None
        value = metrics[self.metric]
        self.peak = value if self.peak is None else max(self.peak, value)
        if self.below_best > 0 and self.peak - value > self.below_best:
            return (
                f"{self.metric} {value:.3f} is {self.peak - value:.3f} below its best "
                f"{self.peak:.3f} (eval.stop_below_best={self.below_best:g})"
            )
        if self.patience <= 0:
            return None
        if self.best is None or value > self.best + self.min_delta:
            self.best, self.without_gain = value, 0
            return None
        self.without_gain += 1
        if self.without_gain < self.patience:
            return None
        return (
            f"no gain in {self.metric} over {self.without_gain} evaluations "
            f"(best {self.best:.3f}; eval.patience={self.patience})"
        )

    def starved(self, now: float, state: Any) -> str | None:
        """Look at the shards' totals at ``now``; the reason to stop, or None."""
        if self.drops is None:
            return None
        line = self.drops.observe_state(now, state)
        return None if line is None else f"starved: {line} (run.stop_when_starved_s)"


def rules_for(config: Any) -> StopRules:
    """The run's stop rules from its config (``eval``, ``run``, ``env`` sections)."""
    metric = config.eval.patience_metric or (
        "eval/success" if config.env.name else "eval/completed"
    )
    return StopRules(
        config.eval.patience,
        metric,
        config.eval.min_delta,
        config.run.stop_when_starved_s,
        config.eval.stop_below_best,
    )
