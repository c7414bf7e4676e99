"""Per-step metrics: one JSON object per learner step in ``metrics.jsonl`` plus a console line."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, TextIO


class MetricsLog:
    def __init__(self, path: Path, console: TextIO | None = None) -> None:
        self.file = path.open("a", buffering=1)
        self.console = console
        self.start = time.time()

    def write(self, record: dict[str, Any]) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in record.items()
        }
        self.file.write(json.dumps(clean) + "\n")
        if self.console is not None:
            print(summary_line(record), file=self.console, flush=True)

    def event(self, kind: str, **fields: Any) -> None:
        self.file.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")

    def close(self) -> None:
        self.file.close()


def summary_line(r: dict[str, Any]) -> str:
    return (
        f"step {r['step']:>4} | reward {r.get('reward/mean', float('nan')):.3f} "
        f"| staleness {r.get('staleness/mean', float('nan')):.2f}/{r.get('staleness/max', 0):.0f} "
        f"| {r.get('throughput/tokens_per_s', 0.0):.0f} tok/s "
        f"| buffer {r.get('buffer/size', 0)} "
        f"| gen versions {r.get('generators/min_version', 0)}-{r.get('generators/max_version', 0)}"
    )
