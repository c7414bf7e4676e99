"""Seeded input generators shared by the fuzz tests (tests/fuzz/test_*.py).

``msgpack_corpus`` builds the inputs every msgpack endpoint gets: random bytes, truncations
and byte mutations of valid frames, valid msgpack of the wrong types (field by field), wrong
or missing struct tags, huge and out-of-range ints, NaN/inf, invalid UTF-8, ext types,
container headers that claim 4 Gi elements, deep nesting, valid messages of the wrong kind,
empty frames and multipart junk. An input is ``bytes`` (one frame) or ``list[bytes]`` (one
multipart message). Oversized frames are not in the corpus: a server with a size limit drops
the sending peer's connection (and whatever it had in flight), so each test sends those on a
socket of their own.

``Tally`` prints the line each test reports: ``fuzz <endpoint>: <N> inputs, <crashes>
crashes, counters {...}`` (visible with ``pytest -s``).
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec

from streamrl.transport import DECODE_ERRORS

Input = bytes | list[bytes]

# Values that break assumptions: wrong types, int64/uint64 edges, non-finite floats, empties.
INTERESTING: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    127,
    -129,
    2**31 - 1,
    -(2**31),
    2**32,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    0.5,
    -0.0,
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    "",
    "x" * 300,
    "\u00e9\u4e2d\U0001f600",
    b"",
    b"\x00\x01\x02",
    b"\xff" * 7,
    [],
    [1, 2, 3],
    ["a", None],
    {},
    {"a": 1},
    {"type": "batch_request"},
    [[[[[]]]]],
]

# Raw msgpack fragments with no builtin equivalent: bad markers, ext types, length bombs.
RAW_SPECIALS: list[bytes] = [
    b"",
    b"\xc1",  # never used marker
    b"\xc0",  # nil
    b"\xd4\x01\x00",  # fixext 1
    b"\xd6\xff\x00\x00\x00\x00",  # timestamp 32
    b"\xc7\x03\x05abc",  # ext 8
    b"\xdd\xff\xff\xff\xff",  # array 32 claiming 4 Gi elements
    b"\xdf\xff\xff\xff\xff",  # map 32 claiming 4 Gi pairs
    b"\xdb\xff\xff\xff\xff",  # str 32 claiming 4 GiB
    b"\xc6\xff\xff\xff\xff",  # bin 32 claiming 4 GiB
    b"\xc9\xff\xff\xff\xff\x01",  # ext 32 claiming 4 GiB
    b"\xcf" + b"\xff" * 8,  # uint64 max
    b"\xd3\x80" + b"\x00" * 7,  # int64 min
    b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00",  # float64 NaN
    b"\xa4\xff\xfe\xfd\xfc",  # fixstr with invalid UTF-8
    b"\x81\xa4type\xa4\xc3\x28\xa0\xa1",  # {"type": invalid UTF-8}
    b"\x91" * 20_000 + b"\xc0",  # arrays nested 20,000 deep
    b"\x81\xa1a" * 5_000 + b"\xc0",  # maps nested 5,000 deep
    b"\x81\xa4type" + b"\x91" * 20_000 + b"\xc0",  # deep under the tag
]


def builtins_of(message: Any) -> Any:
    """A struct (or anything msgspec encodes) as plain builtins, bytes kept as bytes."""
    return msgspec.to_builtins(message, builtin_types=(bytes,))


def encode(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


def mutate_bytes(rng: random.Random, frame: bytes) -> bytes:
    """1-4 random edits: set/flip a byte, insert, delete or duplicate a run, splice."""
    data = bytearray(frame)
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(6)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:  # set a byte, often to a msgpack type marker
            pick = rng.random()
            value = rng.randrange(0xC0, 0x100) if pick < 0.5 else rng.randrange(256)
            data[min(pos, len(data) - 1)] = value
        elif op == 1 and data:
            data[min(pos, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 2:
            data[pos:pos] = rng.randbytes(rng.randrange(1, 9))
        elif op == 3 and data:
            del data[pos : pos + rng.randrange(1, 9)]
        elif op == 4 and data:
            start = rng.randrange(len(data))
            data[pos:pos] = data[start : start + rng.randrange(1, 17)]
        elif data:  # off-by-one lengths: bump a byte up or down
            i = min(pos, len(data) - 1)
            data[i] = (data[i] + rng.choice((1, -1))) % 256
    return bytes(data)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A random msgpack-able builtin value, nested a few levels."""
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice(INTERESTING)
    if kind == 1:
        return rng.randrange(-(2**63), 2**64)
    if kind == 2:
        return rng.uniform(-1e6, 1e6)
    if kind == 3:
        return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(12)))
    if kind == 4:
        return rng.randbytes(rng.randrange(16))
    if kind == 5:
        return rng.choice((None, True, False))
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 7:
        return {
            rng.choice(("type", "a", "k", "", "request_id")): random_value(rng, depth + 1)
            for _ in range(rng.randrange(5))
        }
    return {"type": rng.choice(("x", "", "batch", "heartbeat")), "v": random_value(rng, depth + 1)}


def field_mutations(rng: random.Random, message: dict[str, Any], tags: Sequence[str]) -> Any:
    """``message`` (a struct as a dict) with one structural change: a field of the wrong type
    or an edge value, a field removed, an unknown field added, the tag changed or dropped,
    a non-string key, or a nested list/dict field mutated the same way."""
    out = dict(message)
    keys = list(out)
    op = rng.randrange(7)
    if op <= 1 and keys:
        out[rng.choice(keys)] = rng.choice(INTERESTING) if op == 0 else random_value(rng)
    elif op == 2 and keys:
        del out[rng.choice(keys)]
    elif op == 3:
        out[rng.choice(("extra", "type2", "x" * 40))] = random_value(rng)
    elif op == 4 and "type" in out:
        choice = rng.randrange(3)
        if choice == 0:
            del out["type"]
        else:
            out["type"] = rng.choice(tags) if choice == 1 else rng.choice(INTERESTING)
    elif op == 5:
        return {**out, rng.choice((1, -1, 2.5, b"k", None, True)): 1}
    else:  # recurse into a nested container, if any
        nested = [k for k in keys if isinstance(out[k], dict | list) and out[k]]
        if not nested:
            return field_mutations(rng, out, tags) if keys else out
        key = rng.choice(nested)
        value = out[key]
        if isinstance(value, dict):
            out[key] = field_mutations(rng, value, tags)
        else:
            items = list(value)
            i = rng.randrange(len(items))
            item = items[i]
            items[i] = (
                field_mutations(rng, item, tags)
                if isinstance(item, dict)
                else rng.choice(INTERESTING)
            )
            out[key] = items
    return out


def msgpack_corpus(
    rng: random.Random,
    seeds: Sequence[Any],
    n: int,
    *,
    other_kinds: Sequence[Any] = (),
    tags: Sequence[str] = (),
    multipart: bool = True,
) -> list[Input]:
    """``n`` inputs for an endpoint whose valid messages look like ``seeds`` (structs).

    About: 10% random bytes, 8% truncations, 40% byte mutations of a valid frame, 20% one
    structural change (``field_mutations``), 7% random msgpack values, 5% raw specials (ext
    types, length bombs, deep nesting, invalid UTF-8), 5% valid messages of another kind,
    5% multipart junk (``multipart=False`` folds it into the mutations).
    """
    frames = [encode(s) for s in seeds]
    dicts = [builtins_of(s) for s in seeds]
    kinds = [encode(k) for k in other_kinds]
    out: list[Input] = []
    for _ in range(n):
        r = rng.random()
        frame = rng.choice(frames)
        if r < 0.10:
            size = rng.randrange(0, 64) if rng.random() < 0.7 else rng.randrange(64, 4096)
            out.append(rng.randbytes(size))
        elif r < 0.18:
            out.append(frame[: rng.randrange(len(frame))])
        elif r < 0.58 or (r >= 0.95 and not multipart):
            out.append(mutate_bytes(rng, frame))
        elif r < 0.78:
            out.append(encode(field_mutations(rng, rng.choice(dicts), tags)))
        elif r < 0.85:
            out.append(encode(random_value(rng)))
        elif r < 0.90:
            special = rng.choice(RAW_SPECIALS)
            body = encode({k: v for k, v in rng.choice(dicts).items() if k != "x"})
            if rng.random() < 0.3 and len(special) < 64 and 0x80 <= body[0] < 0x8F:
                # as the value of an extra field "x" of a valid message (fixmap count + 1)
                special = bytes([body[0] + 1]) + body[1:] + b"\xa1x" + special
            out.append(special)
        elif r < 0.95:
            out.append(rng.choice(kinds) if kinds else mutate_bytes(rng, frame))
        else:
            parts = rng.randrange(2, 5)
            pool = [b"", frame, rng.randbytes(rng.randrange(32)), mutate_bytes(rng, frame)]
            out.append([rng.choice(pool) for _ in range(parts)])
    return out


def classify(
    inputs: Sequence[Input], decode: Callable[[bytes], Any]
) -> tuple[list[Any | None], Counter[str]]:
    """Decode every single-frame input locally as the server does: the decoded message (or
    ``None``) per input, and how many were malformed by kind (``frames`` for multipart)."""
    decoded: list[Any | None] = []
    kinds: Counter[str] = Counter()
    for item in inputs:
        if isinstance(item, list):
            decoded.append(None)
            kinds["frames"] += 1
            continue
        try:
            decoded.append(decode(item))
        except DECODE_ERRORS as exc:
            decoded.append(None)
            kinds[type(exc).__name__] += 1
    return decoded, kinds


class Tally:
    """Counts and the one line each fuzz test prints (``fuzz <endpoint>: ...``)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.inputs = 0
        self.crashes = 0
        self.start = time.perf_counter()

    def report(self, counters: dict[str, Any]) -> str:
        elapsed = time.perf_counter() - self.start
        line = (
            f"fuzz {self.endpoint}: {self.inputs} inputs, {self.crashes} crashes, "
            f"counters {dict(sorted(counters.items()))} ({elapsed:.1f}s)"
        )
        print(line, flush=True)
        return line


def send(sock: Any, message: bytes | list[bytes]) -> None:
    """One input on a ZeroMQ socket: a list is one multipart message."""
    if isinstance(message, list):
        sock.send_multipart(message)
    else:
        sock.send(message)


def send_all(
    sock: Any, inputs: Sequence[Any], tally: Tally, after_each: Callable[[], Any] = lambda: None
) -> None:
    """Send every input, counting each in ``tally``, and call ``after_each`` after each one
    (e.g. read replies so they never pile up)."""
    for item in inputs:
        send(sock, item)
        tally.inputs += 1
        after_each()


@contextlib.contextmanager
def serving(shard: Any) -> Iterator[Any]:
    """A ``BufferShard`` serving from a thread of this process; stopped, joined and closed
    at the end (the thread must end)."""
    thread = threading.Thread(target=shard.serve, daemon=True)
    thread.start()
    try:
        yield shard
    finally:
        shard.stop()
        thread.join(10)
        assert not thread.is_alive()
        shard.close()
