"""Per-step metrics: ``metrics.jsonl`` always, a console line per step (with a progress bar on a
terminal), and Weights & Biases when configured (step axis = learner version; the resolved
config attached).

Writes come from the controller loop (steps) and from admin API threads (events): one lock.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from streamrl.config import Config, to_dict
from streamrl.eval_answers import wandb_table


class MetricsLog:
    def __init__(
        self, path: Path, console: TextIO | None = None, config: Config | None = None
    ) -> None:
        self.file = path.open("a", buffering=1)
        self.console = console
        self.start = time.time()
        self.lock = threading.Lock()
        self.progress = self.task = None
        self.wandb = None
        if config is not None:
            self._start_progress(config)
            self._start_wandb(config, path.parent)

    def _start_progress(self, config: Config) -> None:
        if self.console is None or not config.logging.progress:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        console = Console(file=self.console, highlight=False, soft_wrap=True)
        if console.is_jupyter or not console.is_interactive:
            # A bar needs a terminal that redraws it. Elsewhere the step lines alone, printed
            # plainly: to a pipe or a file rich would draw nothing anyway, and in a notebook
            # (``streamrl.train``) rich writes through IPython's display instead of the
            # console, and its live bar (an ipywidget redrawn from a thread) swallows lines.
            return
        self.progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task("steps", total=config.run.max_steps)
        self.progress.start()

    def _start_wandb(self, config: Config, run_dir: Path) -> None:
        if config.logging.wandb == "disabled":
            return
        import wandb

        self.wandb = wandb.init(
            project=config.logging.wandb_project,
            name=config.run.name,
            dir=str(run_dir),
            mode=config.logging.wandb,
            config=to_dict(config),
        )
        # One explicit step axis: the learner version.
        self.wandb.define_metric("step")
        self.wandb.define_metric("*", step_metric="step")

    def write(self, record: dict[str, Any]) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in record.items()
        }
        with self.lock:
            self.file.write(json.dumps(clean) + "\n")
            if self.wandb is not None:
                self.wandb.log({k: v for k, v in clean.items() if v is not None})
        self._print(summary_line(record))
        if self.progress is not None:
            self.progress.update(self.task, completed=record["step"])

    def eval(
        self,
        requested: int,
        version: int,
        metrics: dict[str, float],
        epoch: int = 0,
        answers: list[dict[str, Any]] | None = None,
    ) -> None:
        """A held-out evaluation: an ``eval`` event in metrics.jsonl (step records stay one
        per learner step) with the learner epoch of the weights evaluated, wandb at step
        ``requested`` (with the kept ``answers`` as its ``eval/answers`` table), and a console
        line."""
        line = {
            "event": "eval",
            "time": time.time(),
            "requested": requested,
            "epoch": epoch,
            **metrics,
        }
        with self.lock:
            self.file.write(json.dumps(line) + "\n")
            if self.wandb is not None:
                table = {"eval/answers": wandb_table(answers)} if answers else {}
                self.wandb.log({"step": requested, **metrics, **table})
        if "eval/success" in metrics:  # multi-turn episodes (streamrl.envs)
            counts = "".join(
                f" | {key.removeprefix('eval/')} {metrics[key]:.2f}"
                for key in ("eval/turns", "eval/tool_calls", "eval/guesses")
                if key in metrics
            )
            text = (
                f"eval v{version:>3} | success {metrics['eval/success']:.3f} "
                f"| completed {metrics.get('eval/completed', 0.0):.3f}{counts} "
                f"| reward {metrics.get('eval/reward_mean', 0.0):.3f} "
                f"| {metrics.get('eval/prompts', 0):.0f} prompts"
            )
        else:
            rules = (  # absent when every reward is served (a reward model, a judge)
                f"| accuracy {metrics.get('eval/accuracy', 0.0):.3f} "
                f"| reward {metrics.get('eval/reward_mean', 0.0):.3f} "
                if "eval/accuracy" in metrics or "eval/reward_mean" in metrics
                else ""
            )
            served = "".join(  # the served rewards' mean scores (docs/design.md §7c)
                f"| {key.removeprefix('eval/reward/')} {value:.3f} "
                for key, value in metrics.items()
                if key.startswith("eval/reward/") and not key.endswith("/unparsable")
            )
            text = (
                f"eval v{version:>3} | exact {metrics.get('eval/exact_match', 0.0):.3f} "
                f"| completed {metrics.get('eval/completed', 0.0):.3f} {rules}{served}"
                f"| {metrics.get('eval/prompts', 0):.0f} prompts"
            )
        self._print(text)

    def _print(self, text: str) -> None:
        """A console line, above the progress bar when there is one."""
        if self.progress is not None:
            self.progress.console.print(text)
        elif self.console is not None:
            print(text, file=self.console, flush=True)

    def event(self, kind: str, **fields: Any) -> None:
        with self.lock:
            self.file.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        with self.lock:
            if self.wandb is not None:
                self.wandb.finish()
                self.wandb = None
            self.file.close()


def summary_line(r: dict[str, Any]) -> str:
    return (
        f"step {r['step']:>4} | reward {r.get('reward/mean', float('nan')):.3f} "
        f"| staleness {r.get('staleness/mean', float('nan')):.2f}/{r.get('staleness/max', 0):.0f} "
        f"| {r.get('throughput/tokens_per_s', 0.0):.0f} tok/s "
        f"| buffer {r.get('buffer/size', 0)} "
        f"| gen versions {r.get('generators/min_version', 0)}-{r.get('generators/max_version', 0)}"
        f" | useful {100 * r.get('generation/useful', 0.0):.0f}%"
    )
