"""Serve the admin app with uvicorn on uvloop in a background thread of the controller.

``start_admin`` is the one call the controller makes: it resolves the token, writes
``RUN_DIR/admin.token`` (0600), binds ``admin.host:admin.port`` itself (port 0 → a free port,
known before the server runs), starts uvicorn on that socket, waits until it answers, and
writes ``RUN_DIR/admin.url``. ``AdminServer.stop()`` ends it. Bodies over ``MAX_BODY_BYTES``
are refused with 413 before the app reads them; ``AdminServer.statuses`` counts responses by
status (401 wrong token, 404/405 unknown path or method, 413, 422 bad JSON or values).

The default bind is 127.0.0.1. Any other address is served with a warning: plain HTTP, so the
token crosses the network in clear; put a TLS proxy or an SSH tunnel in front instead.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from streamrl.admin.api import EventSink, RunControl, create_app
from streamrl.admin.auth import URL_FILE, resolve_token, write_token
from streamrl.config import AdminConfig, ConfigError
from streamrl.files import atomic_write_text

log = logging.getLogger("streamrl.admin")

# No admin request needs more: a PATCH is a few keys. FastAPI reads a body whole, before the
# token is checked, so without a limit anyone who reaches the port could make it buffer GiBs.
MAX_BODY_BYTES = 1 << 20


class AdminServer:
    """uvicorn serving ``app`` on a socket bound here, from a daemon thread.

    Example: ``AdminServer(app, "127.0.0.1", 0).start().url`` → ``http://127.0.0.1:41873``;
    the port is read from the bound socket, so it is real before uvicorn starts.
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = MAX_BODY_BYTES
    ) -> None:
        import uvicorn

        self.host = host
        self.guard = BodyLimit(app, max_body_bytes)
        self.sock = bind_socket(host, port)
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://{_url_host(host, self.sock)}:{self.port}"
        config = uvicorn.Config(
            self.guard,
            loop=_loop_name(),
            # h11 always: uvicorn's "auto" picks httptools when some other package installed it
            # (vLLM's fastapi[standard] does), and httptools answers malformed requests itself,
            # past BodyLimit's count of every response.
            http="h11",
            lifespan="off",
            log_config=None,  # leave the controller's logging as it is
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, daemon=True, name="admin-http")
        self._error: BaseException | None = None

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self.sock])
        except BaseException as exc:  # SystemExit included: uvicorn exits on startup failure
            self._error = exc

    def start(self, timeout_s: float = 10.0) -> AdminServer:
        self._thread.start()
        ticks = int(timeout_s / 0.02)
        for _ in range(ticks):
            if self._server.started:
                return self
            if not self._thread.is_alive():
                break
            self._thread.join(0.02)
        self.stop()
        raise RuntimeError(f"admin endpoint did not start on {self.url}: {self._error!r}")

    def stop(self, timeout_s: float = 5.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.sock.close()

    @property
    def statuses(self) -> Counter[int]:
        """Responses sent, by HTTP status (401: wrong token, 413: body too large, ...)."""
        return self.guard.statuses


class BodyLimit:
    """ASGI wrapper: refuses a body over ``max_body_bytes`` with 413 (and closes the
    connection) before the app sees any of it, and counts responses by status.

    The body is read here (up to the limit) and handed to the app in one piece. A declared
    ``Content-Length`` over the limit is refused without reading anything. Runs on the
    server's event loop only, so the counter needs no lock.
    """

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.statuses: Counter[int] = Counter()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                self.statuses[message["status"]] += 1
            await send(message)

        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(counting_send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await self._too_large(counting_send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, counting_send)

    async def _too_large(self, send: Any) -> None:
        text = f'{{"detail":"request body over {self.max_body_bytes} bytes"}}'.encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(text)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": text})


def start_admin(
    control: RunControl,
    admin: AdminConfig,
    run_dir: Path,
    on_event: EventSink | None = None,
) -> AdminServer:
    """Token file, app, server, ``admin.url``: everything the controller needs, in one call."""
    run_dir = Path(run_dir)
    token = resolve_token(admin.token)
    write_token(run_dir, token)
    app = create_app(control, token, run_dir=run_dir, on_event=on_event)
    server = AdminServer(app, admin.host, admin.port).start()
    if not is_loopback(server.sock):
        log.warning(
            "admin endpoint bound to %s:%d is reachable from other machines over plain HTTP; "
            "anyone who reads the token can steer the run",
            admin.host,
            server.port,
        )
    atomic_write_text(run_dir / URL_FILE, server.url + "\n")
    return server


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6 as ``host`` resolves)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"admin.host {host!r}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind the admin endpoint to {host}:{port}: {exc}") from None
    return sock


def is_loopback(sock: socket.socket) -> bool:
    return ipaddress.ip_address(sock.getsockname()[0]).is_loopback


def _url_host(host: str, sock: socket.socket) -> str:
    """The host to put in admin.url: a wildcard bind is reached locally through loopback."""
    address = ipaddress.ip_address(sock.getsockname()[0])
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    elif not _is_ip(host):
        return host  # keep a name the user chose (localhost, a DNS name)
    return f"[{address}]" if address.version == 6 else str(address)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:  # platforms without uvloop still get an admin endpoint
        return "asyncio"
    return "uvloop"
