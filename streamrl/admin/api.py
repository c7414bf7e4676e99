"""The admin API: a FastAPI app over a ``RunControl`` (the controller, or a fake in tests).

| method | path           | auth | does                                                        |
|--------|----------------|------|-------------------------------------------------------------|
| GET    | /health        | no   | ``{"ok": true}``: the process answers                       |
| GET    | /docs          | no   | OpenAPI UI (schema only; its Authorize button takes a token) |
| GET    | /status        | yes  | ``RunControl.status()`` plus the live keys' current values   |
| GET    | /metrics       | yes  | ``RunControl.metrics()`` in Prometheus text format          |
| GET    | /config        | yes  | the resolved config (``admin.token`` redacted)              |
| GET    | /config/live   | yes  | the live keys: type, rule, where each takes effect          |
| PATCH  | /config        | yes  | flat ``{"buffer.capacity": 128}``; all or nothing; audited  |
| POST   | /pause /resume | yes  | stop / restart admitting new prompt groups                  |
| POST   | /stop          | yes  | graceful stop: the run ends as if it had reached max_steps  |
| POST   | /checkpoint    | yes  | ``RunControl.checkpoint()``; 501 until checkpoints exist    |

Errors: 401 for a missing or wrong ``Authorization: Bearer <token>``; 422 for an unknown key or
a bad value (``detail`` says why); 409 for a key that cannot change live (``detail`` names it)
or an action the run cannot take now; 501 for what is not implemented.

Handlers are plain ``def``s: FastAPI runs them on its worker threads, so a slow ``RunControl``
call (waiting for buffer shards to acknowledge) never stalls ``/health``. ``RunControl`` must
therefore be thread-safe. Patches are serialised by one lock here: validation reads the
config that ``apply_live`` will change, and two patches must not interleave.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from streamrl.admin.audit import AuditLog
from streamrl.admin.auth import AUDIT_FILE, token_matches
from streamrl.admin.live import LIVE_KEYS, PatchError, describe, live_values, validate_patch

log = logging.getLogger("streamrl.admin")

EventSink = Callable[[str, dict[str, Any]], None]


class RunControl(Protocol):
    """What the admin API needs from the controller. Every method is called from an HTTP
    worker thread, never from the controller's own loop: take the controller's locks.

    ``status()`` is JSON-able; the CLI pretty-prints these keys when present::

        {"run": "demo", "mode": "async", "state": "running",   # running|paused|stopping
         "version": 12, "max_steps": 100, "steps_per_s": 0.42, "tokens_per_s": 812.5,
         "roles": {"learner-0": {"alive": true, "last_heartbeat": 1717000000.0,
                                 "restarts": 0}, ...},
         "shards": [{"shard_id": 0, "size": 40, "capacity": 256, "dropped": {"stale": 3}}],
         "staleness_hist": {"0": 30, "1": 10},
         "generators": [{"generator_id": 0, "applied_version": 12}]}

    The API adds ``"live"`` (each live key's value from ``config()``) unless it is there.
    """

    def status(self) -> dict[str, Any]: ...

    def config(self) -> dict[str, Any]:
        """The resolved config as builtins (``config.to_dict``), live changes included."""
        ...

    def apply_live(self, changes: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Apply already validated changes (dotted keys, config types) all or nothing.

        Returns ``{key: (old, new)}``. Raises ``ValueError`` (→ 422) to refuse the patch, or
        ``RuntimeError`` (→ 409) when the run cannot take it now; either way nothing changed.
        """
        ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> None:
        """Ask for a graceful stop and return at once (the run winds down on its own)."""
        ...

    def checkpoint(self) -> dict[str, Any]:
        """Write a checkpoint; may raise ``NotImplementedError`` (→ 501)."""
        ...

    def metrics(self) -> dict[str, float]:
        """Flat numeric metrics (``{"reward/mean": 0.4}``) for ``/metrics``."""
        ...


def create_app(
    control: RunControl,
    token: str,
    run_dir: Path | None = None,
    on_event: EventSink | None = None,
) -> FastAPI:
    """The admin app. ``run_dir`` gets ``audit.jsonl`` (no audit file when None);
    ``on_event(kind, fields)`` hears every change (the controller logs it in metrics.jsonl)."""
    audit = AuditLog(Path(run_dir) / AUDIT_FILE) if run_dir is not None else None
    patch_lock = threading.Lock()
    bearer = HTTPBearer(auto_error=False, description="the token in RUN_DIR/admin.token")

    def require_token(
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
    ) -> None:
        if credentials is None or not token_matches(credentials.credentials, token):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    def record(kind: str, **fields: Any) -> None:
        # The change already happened: a failing audit or event sink must not turn it into
        # an error answer, only into a loud log line.
        try:
            if audit is not None:
                audit.append(**fields)
            if on_event is not None:
                on_event(kind, fields)
        except Exception:
            log.exception("admin: could not record %s %s", kind, fields)

    app = FastAPI(
        title="streamrl admin",
        description="Inspect and steer a running streamrl job. "
        "Every route but /health and /docs needs `Authorization: Bearer <token>` "
        "(the token is in RUN_DIR/admin.token).",
    )
    router = APIRouter(dependencies=[Depends(require_token)])

    @app.get("/health", tags=["open"])
    def health() -> dict[str, bool]:
        """Liveness probe; needs no token and tells nothing about the run."""
        return {"ok": True}

    @router.get("/status")
    def status() -> dict[str, Any]:
        """Run, learner version and step rate, role health, shards, staleness, generators."""
        with _calling("status"):
            out = dict(control.status())
            out.setdefault("live", live_values(control.config()))
        return out

    @router.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        """The controller's latest metrics in Prometheus text format (all gauges)."""
        with _calling("metrics"):
            text = render_prometheus(control.metrics())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @router.get("/config")
    def get_config() -> dict[str, Any]:
        """The resolved config, live changes included."""
        with _calling("config"):
            return _redacted(control.config())

    @router.get("/config/live")
    def get_live_keys() -> dict[str, dict[str, str]]:
        """The keys PATCH /config accepts, with type, rule and where each takes effect."""
        return {key: describe(key) for key in LIVE_KEYS}

    @router.patch("/config")
    def patch_config(
        request: Request,
        changes: dict[str, Any] = Body(
            ..., examples=[{"buffer.capacity": 128, "generator.temperature": 0.7}]
        ),
    ) -> dict[str, Any]:
        """Change live keys, all or nothing: 422 bad key or value, 409 key not live."""
        client = _client(request)
        with patch_lock:
            with _calling("config"):
                converted = validate_patch(changes, control.config())
            if not converted:
                return {"changed": {}}
            with _calling("apply_live"):
                applied = control.apply_live(converted)
            changed = {}
            for key, (old, new) in applied.items():
                if old == new:
                    continue
                changed[key] = {"old": old, "new": new}
                record("admin_set", key=key, old=old, new=new, client=client)
        return {"changed": changed}

    def action(name: str, call: Callable[[], Any]) -> Callable[[Request], dict[str, Any]]:
        def handler(request: Request) -> dict[str, Any]:
            with _calling(name):
                result = call()
            record(f"admin_{name}", action=name, client=_client(request))
            return {"ok": True, **(result or {})}

        handler.__name__ = name
        return handler

    router.post("/pause", summary="Stop admitting new prompt groups")(
        action("pause", control.pause)
    )
    router.post("/resume", summary="Admit new prompt groups again")(
        action("resume", control.resume)
    )
    router.post("/stop", summary="Stop the run gracefully")(action("stop", control.stop))
    router.post("/checkpoint", summary="Write a checkpoint now")(
        action("checkpoint", control.checkpoint)
    )
    app.include_router(router)

    @app.exception_handler(PatchError)
    def patch_error(request: Request, exc: PatchError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "problems": exc.problems}, exc.status)

    @app.exception_handler(RequestValidationError)
    def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each error's input, the whole body, and fails (500)
        # when that body is not UTF-8. Say what is wrong, not what was sent.
        keep = ("type", "loc", "msg")
        problems = [{k: e[k] for k in keep if k in e} for e in exc.errors()]
        return JSONResponse({"detail": problems}, 422)

    return app


@contextmanager
def _calling(what: str) -> Iterator[None]:
    """Map a ``RunControl`` refusal to an HTTP answer; anything else is a 500 (and logged)."""
    try:
        yield
    except (HTTPException, PatchError):
        raise
    except NotImplementedError as exc:
        raise HTTPException(501, str(exc) or f"{what} is not implemented yet") from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    except RuntimeError as exc:
        raise HTTPException(409, str(exc)) from None


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _redacted(config: dict[str, Any]) -> dict[str, Any]:
    admin = config.get("admin")
    if isinstance(admin, dict) and admin.get("token") is not None:
        config = {**config, "admin": {**admin, "token": "<redacted>"}}
    return config


# --------------------------------------------------------------------------- Prometheus

_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_name(name: str, prefix: str = "streamrl_") -> str:
    """``reward/mean`` → ``streamrl_reward_mean`` (Prometheus names are ``[a-zA-Z0-9_:]``)."""
    return prefix + _NOT_IN_NAME.sub("_", name)


def render_prometheus(metrics: Mapping[str, Any], prefix: str = "streamrl_") -> str:
    """Prometheus text exposition (format 0.0.4): every numeric value as a gauge.

    Non-numeric values are skipped; booleans become 0/1; when two names sanitise to the same
    metric the first (in sorted order) wins, since a family may appear only once.
    """
    lines: list[str] = []
    seen: set[str] = set()
    for name in sorted(metrics):
        value = metrics[name]
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float)):
            continue
        metric = prometheus_name(name, prefix)
        if metric in seen:
            continue
        seen.add(metric)
        help_text = name.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [
            f"# HELP {metric} {help_text}",
            f"# TYPE {metric} gauge",
            f"{metric} {_prometheus_value(value)}",
        ]
    return "\n".join(lines) + "\n" if lines else ""


def _prometheus_value(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
