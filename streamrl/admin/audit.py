"""``RUN_DIR/audit.jsonl``: one JSON line per change made through the admin endpoint.

A key change is ``{"time", "key", "old", "new", "client"}``; an action (pause, resume, stop,
checkpoint) is ``{"time", "action", "client"}``. Lines are appended under a lock and flushed
at once, so the file is a complete record even if the controller dies right after.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, **fields: Any) -> dict[str, Any]:
        record = {"time": time.time(), **fields}
        line = json.dumps(record, default=str) + "\n"
        with self._lock, self.path.open("a") as f:
            f.write(line)
        return record

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]
