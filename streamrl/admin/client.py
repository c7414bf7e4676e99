"""A stdlib-only client for the admin endpoint, and the text ``streamrl admin`` prints.

``AdminClient.from_run_dir(RUN_DIR)`` reads ``RUN_DIR/admin.url`` and ``RUN_DIR/admin.token``.
Every failure (no such run, run not reachable, 401, 409, 422, 501) is an ``AdminError`` whose
message is one line for the user. Proxies from the environment are ignored: the endpoint is
addressed directly, usually on loopback.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from streamrl.admin.auth import TOKEN_FILE, URL_FILE, read_token


class AdminError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AdminClient:
    def __init__(self, url: str, token: str, timeout_s: float = 10.0) -> None:
        self.url, self.token, self.timeout_s = url.rstrip("/"), token, timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @classmethod
    def from_run_dir(cls, run_dir: str | Path, timeout_s: float = 10.0) -> AdminClient:
        run_dir = Path(run_dir)
        url_file = run_dir / URL_FILE
        if not run_dir.is_dir():
            raise AdminError(f"{run_dir} is not a directory")
        if not url_file.is_file():
            raise AdminError(f"{url_file} not found: not a run directory, or the run never started")
        try:
            token = read_token(run_dir)
        except OSError as exc:
            raise AdminError(f"cannot read {run_dir / TOKEN_FILE}: {exc.strerror}") from None
        return cls(url_file.read_text().strip(), token, timeout_s)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request; the decoded JSON (or text) answer, or ``AdminError``."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                payload = response.read().decode()
                kind = response.headers.get_content_type()
        except urllib.error.HTTPError as exc:
            raise AdminError(_http_error_line(exc), exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(
                f"cannot reach the run at {self.url} ({reason}); has it finished?"
            ) from None
        except http.client.HTTPException as exc:
            # Something else listens there now: a finished run's port, taken by another process.
            raise AdminError(
                f"{self.url} does not answer as the run's admin endpoint "
                f"({type(exc).__name__}); has the run finished?"
            ) from None
        if kind != "application/json":
            return payload
        try:
            return json.loads(payload)
        except ValueError:
            raise AdminError(f"{self.url} answered {method} {path} with malformed JSON") from None

    def status(self) -> dict[str, Any]:
        return self.call("GET", "/status")

    def config(self) -> dict[str, Any]:
        return self.call("GET", "/config")

    def set(self, changes: dict[str, Any]) -> dict[str, Any]:
        return self.call("PATCH", "/config", changes)

    def action(self, name: str) -> dict[str, Any]:
        """``pause``, ``resume``, ``stop`` or ``checkpoint``."""
        return self.call("POST", f"/{name}")

    def metrics(self) -> str:
        return self.call("GET", "/metrics")


def _http_error_line(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read().decode()).get("detail")
    except (ValueError, AttributeError, OSError):
        detail = None
    if isinstance(detail, list):  # FastAPI's own request validation errors
        detail = "; ".join(str(item.get("msg", item)) for item in detail)
    line = f"{exc.code} {exc.reason}" + (f": {detail}" if detail else "")
    if exc.code == 401:
        line += " (is admin.token from this run?)"
    return line


# --------------------------------------------------------------------------- printing


def format_status(status: dict[str, Any], now: float | None = None) -> str:
    """A few readable lines from ``GET /status``; keys the controller does not send are
    skipped (``--json`` prints everything)."""
    now = time.time() if now is None else now
    s = status
    head = f"run {s.get('run', '?')} ({s.get('mode', '?')}) {s.get('state', '')}".rstrip()
    version = f"version {s.get('version', '?')}"
    if s.get("max_steps") is not None:
        version += f"/{s['max_steps']}"
    rates = [version]
    if s.get("steps_per_s") is not None:
        rates.append(f"{s['steps_per_s']:.3g} steps/s")
    if s.get("tokens_per_s") is not None:
        rates.append(f"{s['tokens_per_s']:.0f} tokens/s")
    lines = [f"{head}: {', '.join(rates)}"]
    roles = s.get("roles") or {}
    if roles:
        lines.append("roles:")
        for name, role in roles.items():
            alive = "alive" if role.get("alive") else "DOWN"
            beat = role.get("last_heartbeat")
            ago = f"heartbeat {now - beat:.1f}s ago" if beat else "no heartbeat"
            lines.append(f"  {name:<14} {alive:<5} {ago:<22} restarts {role.get('restarts', 0)}")
    shards = s.get("shards") or []
    if shards:
        lines.append("shards:")
        for shard in shards:
            dropped = " ".join(f"{k}={v}" for k, v in (shard.get("dropped") or {}).items())
            fill = f"{shard.get('size', '?')}/{shard.get('capacity', '?')}"
            lines.append(f"  {shard.get('shard_id', '?'):<3} {fill:<10} {dropped}".rstrip())
    generation = s.get("generation") or {}
    if generation.get("tokens"):
        lost = " ".join(
            f"{why} {100 * share:.0f}%" for why, share in (generation.get("lost") or {}).items()
        )
        lines.append(
            f"generation: useful {100 * generation.get('useful', 0.0):.0f}% of "
            f"{generation['tokens']} tokens; lost: {lost}"
        )
    hist = s.get("staleness_hist") or {}
    if hist:
        items = sorted(hist.items(), key=lambda kv: int(kv[0]))
        lines.append("staleness: " + " ".join(f"{k}:{v}" for k, v in items))
    gens = s.get("generators") or []
    if gens:
        lines.append("generators:")
        for g in gens:
            lines.append(
                f"  {g.get('generator_id', '?'):<3} applied version {g.get('applied_version', '?')}"
            )
    live = s.get("live") or {}
    if live:
        lines.append("live: " + " ".join(f"{k}={v}" for k, v in live.items()))
    return "\n".join(lines)


def format_changes(answer: dict[str, Any]) -> str:
    changed = answer.get("changed") or {}
    if not changed:
        return "nothing changed"
    return "\n".join(f"{key}: {c['old']!r} -> {c['new']!r}" for key, c in changed.items())
