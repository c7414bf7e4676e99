"""Fuzzing the admin HTTP API (``admin.server.start_admin``: uvicorn in a thread, the real app)
over a keep-alive client, with a thread-safe stand-in for the run.

Phase 1, 5,000 requests without the right token (missing, wrong, mangled, other schemes):
nothing but the open routes ever answers 2xx and the run is never called at all. Phase 2,
5,000 requests with the token: bad JSON, wrong types, out-of-range and non-finite values,
unknown keys, paths and methods, odd content types, deep nesting, bodies over the limit (413).
No request may get a 5xx, the server's status counters must add up to the requests answered,
and afterwards valid requests are served as before. Then malformed HTTP on raw sockets.
"""

from __future__ import annotations

import json
import random
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fuzzgen import Tally, mutate_bytes

from streamrl.admin.auth import TOKEN_ENV
from streamrl.admin.server import MAX_BODY_BYTES, start_admin
from streamrl.config import AdminConfig, Config, to_dict

TOKEN = "fuzz-token-0123456789abcdef"
N_PER_PHASE = 5_000
N_RAW = 300
OPEN = {"/health", "/docs", "/openapi.json", "/docs/oauth2-redirect"}
ROUTES = {  # path -> the methods it answers
    "/health": ["GET"],
    "/status": ["GET"],
    "/metrics": ["GET"],
    "/config": ["GET", "PATCH", "PATCH", "PATCH"],
    "/config/live": ["GET"],
    "/pause": ["POST"],
    "/resume": ["POST"],
    "/stop": ["POST"],
    "/checkpoint": ["POST"],
    "/docs": ["GET"],
    "/openapi.json": ["GET"],
}
PATHS = list(ROUTES)
METHODS = ["GET", "POST", "PATCH", "PUT", "DELETE", "OPTIONS", "HEAD", "TRACE", "FOO"]
LIVE = {
    "buffer.capacity": 128,
    "buffer.max_staleness": 1,
    "buffer.sampling": "random",
    "buffer.max_reuse": 2,
    "buffer.overflow": "block",
    "buffer.drop_zero_variance": True,
    "generator.temperature": 0.7,
    "generator.prompts_per_call": 4,
    "generator.count": 2,
}
JSON_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    1,
    2**31,
    2**63,
    10**30,
    -(10**30),
    0.5,
    -0.0,
    1e308,
    "",
    "128",
    "random",
    "x" * 500,
    [],
    [1],
    {},
    {"a": 1},
]
RAW_NUMBERS = [b"1e400", b"-1e400", b"NaN", b"Infinity", b"-Infinity", b"1" * 400, b"0.1e-400"]
pytestmark = pytest.mark.slow


class FakeRun:
    """The run as the API sees it: a config dict and a few flags; every call is recorded."""

    def __init__(self) -> None:
        self._config = to_dict(Config())
        self.lock = threading.Lock()
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        with self.lock:
            self.calls.append(name)

    def status(self) -> dict[str, Any]:
        self._call("status")
        return {"run": "fuzz", "state": "running", "version": 3}

    def config(self) -> dict[str, Any]:
        self._call("config")
        with self.lock:
            return json.loads(json.dumps(self._config))

    def apply_live(self, changes: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        self._call("apply_live")
        with self.lock:
            applied = {}
            for dotted, new in changes.items():
                section, key = dotted.split(".")
                applied[dotted] = (self._config[section][key], new)
                self._config[section][key] = new
            return applied

    def pause(self) -> None:
        self._call("pause")

    def resume(self) -> None:
        self._call("resume")

    def stop(self) -> None:
        self._call("stop")

    def checkpoint(self) -> dict[str, Any]:
        self._call("checkpoint")
        raise NotImplementedError("no checkpoints in this test")

    def metrics(self) -> dict[str, float]:
        self._call("metrics")
        return {"reward/mean": 0.25}


def random_path(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.6:
        path = rng.choice(PATHS)
    elif r < 0.8:
        path = rng.choice(PATHS) + rng.choice(["/", "/x", "//", "/..", "%00", "/%2e%2e", ".json"])
    elif r < 0.95:
        chars = "abcxyz/._-~%20%ff%00"
        path = "/" + "".join(rng.choice(chars) for _ in range(rng.randrange(1, 40)))
    else:
        path = "/" + "a" * rng.randrange(1_000, 8_000)
    if rng.random() < 0.1:
        path += "?" + rng.choice(["a=1", "token=" + TOKEN, "x=%ff&&==", "q=" + "z" * 300])
    return path


def random_body(rng: random.Random) -> tuple[bytes | None, str | None]:
    """A body and its content type (None: no header)."""
    r = rng.random()
    patch = {k: LIVE[k] for k in rng.sample(sorted(LIVE), rng.randrange(1, 4))}
    valid = json.dumps(patch).encode()
    if r < 0.1:
        body = None
    elif r < 0.2:
        body = valid
    elif r < 0.4:
        body = mutate_bytes(rng, valid)
    elif r < 0.5:
        body = valid[: rng.randrange(len(valid))]
    elif r < 0.7:  # wrong types and edge values for real keys
        key = rng.choice(sorted(LIVE) + ["learner.lr", "buffer", "nope", "buffer.capacity.x"])
        body = json.dumps({key: rng.choice(JSON_VALUES)}).encode()
    elif r < 0.75:  # numbers JSON cannot hold exactly: inf, NaN, 400 digits
        key = rng.choice(sorted(LIVE))
        body = b'{"' + key.encode() + b'": ' + rng.choice(RAW_NUMBERS) + b"}"
    elif r < 0.85:  # valid JSON, not an object
        body = json.dumps(rng.choice([[patch], "text", 5, None, [], True])).encode()
    elif r < 0.9:
        depth = rng.choice((100, 1_000, 100_000))
        body = b"[" * depth + b"]" * depth if rng.random() < 0.5 else b'{"a":' * depth
    elif r < 0.95:
        body = rng.randbytes(rng.randrange(1, 2_000))
    else:
        body = b'{"buffer.capacity": 1' + b" " * rng.randrange(1_000, 60_000) + b"}"
    kind = rng.choice(
        ["application/json"] * 6
        + [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
        + ["application/json; charset=latin-1", "application/json-patch+json"]
    )
    return body, kind


def random_auth(rng: random.Random) -> bytes | None:
    """A wrong, mangled or missing Authorization header (never the right one)."""
    wrong = [
        None,
        b"Bearer",  # (a trailing space is refused by the client's own HTTP library)
        b"Bearer wrong",
        b"Bearer " + TOKEN[:-1].encode(),
        b"Bearer " + TOKEN.encode() + b"x",
        b"Bearer " + TOKEN.upper().encode(),
        b"bearer  " + TOKEN.encode() + b" x",
        b"Basic " + TOKEN.encode(),
        TOKEN.encode(),
        b"Bearer " + b"\xff\xfe" * 8,
        b"Bearer " + b"A" * 6_000,
    ]
    pick = rng.choice(wrong)
    if pick is None and rng.random() < 0.3:
        # (control characters are refused by the client's own HTTP library)
        mangled = bytes(b for b in mutate_bytes(rng, TOKEN.encode()) if 0x20 <= b != 0x7F)
        if mangled != TOKEN.encode():  # an edit can undo itself
            return b"Bearer " + mangled
    return pick


def send(
    client: httpx.Client,
    rng: random.Random,
    auth: bytes | None,
    counts: dict[str, int],
    patch_share: float = 0.0,
) -> httpx.Response | None:
    """One fuzzed request; ``patch_share`` of them are ``PATCH /config`` (fuzzed body)."""
    if rng.random() < patch_share:
        method, path = "PATCH", "/config"
    else:
        path = random_path(rng)
        known = ROUTES.get(path)
        method = rng.choice(known) if known and rng.random() < 0.7 else rng.choice(METHODS)
    body, kind = random_body(rng) if rng.random() < 0.8 else (None, None)
    if rng.random() < 0.005:  # over the limit: refused before anything reads it
        body, kind = b"{" + b" " * (MAX_BODY_BYTES + rng.randrange(1, 1 << 20)), None
        counts["oversized"] += 1
    headers = {"content-type": kind} if kind else {}
    if auth is not None:
        headers["authorization"] = auth  # type: ignore[assignment]
    try:
        answer = client.request(method, path, content=body, headers=headers)
    except httpx.TransportError:
        counts["transport_errors"] += 1  # only expected when a 413 closes a busy connection
        return None
    counts["answered"] += 1
    return answer


def raw_junk(rng: random.Random) -> bytes:
    good = (
        b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n"
    )
    return rng.choice(
        [
            rng.randbytes(rng.randrange(1, 300)),
            mutate_bytes(rng, good),
            good[: rng.randrange(1, len(good))],
            b"GET / HTTP/9.9\r\n\r\n",
            b"GET " + b"/" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 2_000 + b"\r\n",
            b"PATCH /config HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
            b"PATCH /config HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"\r\n\r\n\r\n",
        ]
    )


def test_admin_api_survives_fuzz_and_keeps_serving(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    tally = Tally("admin")
    fake = FakeRun()
    server = start_admin(fake, AdminConfig(host="127.0.0.1", port=0, token=TOKEN), tmp_path)
    rng = random.Random(13_006)
    counts = {"answered": 0, "oversized": 0, "transport_errors": 0}
    statuses: dict[int, int] = {}
    unauthorized_2xx: list[str] = []
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            # Phase 1: never the right token.
            for _ in range(N_PER_PHASE):
                answer = send(client, rng, random_auth(rng), counts)
                tally.inputs += 1
                if answer is None:
                    continue
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                if answer.is_success and answer.request.url.path not in OPEN:
                    request = answer.request
                    auth = request.headers.get("authorization")
                    unauthorized_2xx.append(f"{request.method} {request.url} {auth!r}")
            assert not unauthorized_2xx, unauthorized_2xx[:5]
            assert fake.calls == []  # the run itself was never reached
            assert statuses[401] > 1_000

            # Phase 2: the right token, everything else fuzzed.
            auth = f"Bearer {TOKEN}".encode()
            for _ in range(N_PER_PHASE):
                answer = send(client, rng, auth, counts, patch_share=0.5)
                tally.inputs += 1
                if answer is not None:
                    statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

            # Valid traffic, on the same keep-alive client.
            headers = {"authorization": f"Bearer {TOKEN}"}
            assert client.get("/health").json() == {"ok": True}
            assert client.get("/status", headers=headers).json()["version"] == 3
            answer = client.patch("/config", json={"generator.count": 3}, headers=headers)
            assert answer.status_code == 200, answer.text
            assert client.get("/config", headers=headers).json()["generator"]["count"] == 3
            assert client.get("/status", headers={"authorization": "Bearer no"}).status_code == 401

        # Every answer the client saw was counted by the server (valid traffic: 5); a 413 can
        # be counted yet lost to the client, which was still sending the body when it closed.
        answered = sum(server.statuses.values())
        seen = counts["answered"] + 5
        assert seen <= answered <= seen + counts["transport_errors"]

        # Malformed HTTP on raw sockets: the HTTP parser refuses most (400, or it closes);
        # what still parses reaches the app.
        raw_answers: dict[str, int] = {}
        for _ in range(N_RAW):
            with socket.create_connection((server.host, server.port), timeout=5) as sock:
                try:  # the server may answer and close before it has read everything
                    sock.sendall(raw_junk(rng))
                    sock.shutdown(socket.SHUT_WR)
                    first = sock.recv(64).split(b"\r\n", 1)[0].decode("latin-1")
                except OSError:
                    first = "reset"
            key = first[9:12] if first.startswith("HTTP/1.1 ") else (first or "closed")
            raw_answers[key] = raw_answers.get(key, 0) + 1
            tally.inputs += 1
        assert httpx.get(f"{server.url}/health").json() == {"ok": True}
        assert answered < sum(server.statuses.values()) <= answered + N_RAW + 1
    finally:
        server_statuses = dict(server.statuses)
        # 501 is /checkpoint's answer (not implemented); any other 5xx is a handler that failed.
        tally.crashes = sum(n for code, n in server_statuses.items() if code >= 500 and code != 501)
        tally.report(
            {
                **{f"http/{code}": n for code, n in server_statuses.items()},
                **counts,
                **{f"raw/{k}": n for k, n in locals().get("raw_answers", {}).items()},
            }
        )
        server.stop()
    assert tally.crashes == 0
    # The refusals rose: 401 token, 404 path, 405 method, 413 body, 422 JSON or value, 400
    # undecodable body.
    for code in (401, 404, 405, 413, 422, 400):
        assert server_statuses.get(code, 0) > 0, code
    assert server_statuses[413] >= counts["oversized"] - counts["transport_errors"]
    assert counts["transport_errors"] <= counts["oversized"]
