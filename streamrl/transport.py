"""ZeroMQ helpers shared by every role.

Rules kept here so no role forgets them: ``linger=0`` on close, high-water marks from config,
endpoints logged once, binds on 127.0.0.1 unless told otherwise, one msgspec Encoder/Decoder
per socket, and malformed frames counted and dropped instead of crashing the process.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter
from typing import Any, Generic, TypeVar

import msgspec
import zmq

log = logging.getLogger(__name__)
T = TypeVar("T")

LOOPBACK = "127.0.0.1"


def resolve_host(bind_host: str) -> str:
    """The address a role binds on: ``bind_host`` itself, or for ``"node"`` (cluster mode,
    ``role_specs``) this node's address as Ray knows it, reachable from other nodes."""
    if bind_host == "node":
        import ray.util

        return ray.util.get_node_ip_address()
    return bind_host


def interface_holding(host: str) -> str | None:
    """The network interface that holds ``host`` (``lo`` for 127.0.0.1), or ``None``.

    For ``GLOO_SOCKET_IFNAME``: without it gloo listens on whatever address the machine's
    hostname resolves to (a network address on most cluster nodes), whatever host the
    process group's store was given."""
    import psutil  # a dependency of accelerate and of vLLM

    address = socket.gethostbyname(host)
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return None


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free right now (for endpoints that cannot bind to port 0, e.g. gloo)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def make_socket(
    ctx: zmq.Context, kind: int, *, sndhwm: int = 1000, rcvhwm: int = 1000, maxmsgsize: int = -1
) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    if maxmsgsize > 0:
        # Oversized frames are refused by libzmq before they are buffered.
        sock.setsockopt(zmq.MAXMSGSIZE, maxmsgsize)
    return sock


def bind_random(sock: zmq.Socket, host: str = LOOPBACK, role: str = "", port: int = 0) -> str:
    """Bind to ``port`` on ``host``, or to a free one when ``port`` is 0; return the endpoint
    (logged once)."""
    if port:
        sock.bind(f"tcp://{host}:{port}")
    else:
        port = sock.bind_to_random_port(f"tcp://{host}")
    endpoint = f"tcp://{host}:{port}"
    log.info("%s bound %s", role or "socket", endpoint)
    return endpoint


# What decoding a peer's bytes can raise: msgspec's own errors, plus UnicodeDecodeError (bad
# UTF-8 in a str field, before msgspec 0.23; a DecodeError since) and RecursionError (absurd
# nesting), which escape them.
DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)


class Codec(Generic[T]):
    """One msgpack encoder/decoder pair for one socket, decoding against ``type_``.

    ``decode`` returns ``None`` for a malformed or unexpected message and counts it by kind,
    logging the first of each kind once (a peer sending garbage must not fill the log).
    """

    def __init__(self, type_: Any, name: str = "") -> None:
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(type_)
        self.name = name or str(type_)
        self.malformed: Counter[str] = Counter()

    def encode(self, message: Any) -> bytes:
        return self.encoder.encode(message)

    def decode(self, frame: bytes | memoryview | zmq.Frame) -> T | None:
        data = frame.buffer if isinstance(frame, zmq.Frame) else frame
        try:
            return self.decoder.decode(data)
        except DECODE_ERRORS as exc:  # a peer's bytes must never crash the process
            self.count_malformed(type(exc).__name__, str(exc))
            return None

    def decode_routed(self, frames: list[bytes]) -> tuple[bytes, T] | None:
        """A ROUTER socket's message as (peer identity, decoded body); ``None`` for anything
        but one identity and one body (counted as ``frames``) or a body that does not decode."""
        if len(frames) != 2:
            self.count_malformed("frames", f"{len(frames) - 1} bodies, not 1")
            return None
        message = self.decode(frames[1])
        return None if message is None else (frames[0], message)

    def count_malformed(self, kind: str, detail: str) -> None:
        """Count one malformed message of ``kind``, logging the first of each kind."""
        if not self.malformed[kind]:
            log.warning("%s: dropped malformed message (%s): %s", self.name, kind, detail)
        self.malformed[kind] += 1

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())
