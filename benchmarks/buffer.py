"""Buffer shard throughput and latency (issue 4). Figures are printed, not asserted.

    python benchmarks/buffer.py [--shards 2] [--producers 2] [--groups 6000]

1. Ingest: M producer processes push pre-encoded ``TrajectoryGroup`` frames (``--group-size``
   trajectories of ``--prompt-tokens`` + ``--response-tokens`` tokens: 1k tokens by default;
   only the group id is patched per frame, so producers cost almost nothing) into 1 shard
   and into S shards (each a ``streamrl.buffers.shard_main`` process), durable log off and
   on. Clocked from the producers' start to the moment the shards' ``ingested`` counters
   reach the total (read with ``StatsRequest`` every 20 ms).
2. Fetch: latency of a 256-trajectory batch (``--fetch-groups`` groups) from shards holding
   enough eligible groups: ``BufferClient.fetch`` (peek + take + decoding every group, what
   a learner pays) and the bare shard round trip (one ``BatchRequest`` -> ``RawBatch``, not
   decoded). Refilled between rounds; refills are not timed.

Targets on the 2-core dev machine: >= 20,000 trajectories/s per shard with the log off,
>= 10,000/s with it on, fetch p99 <= 20 ms. The producers and every shard share those two
cores, so S shards do not get S times the throughput there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import zmq

from streamrl.buffers.client import BufferClient
from streamrl.protocol import (
    BatchRequest,
    RawBatch,
    ShardStats,
    StatsRequest,
    Trajectory,
    TrajectoryGroup,
)

ID_PLACEHOLDER = b"G" * 24  # patched per frame: "<producer:4><seq:20>"


def template_frame(group_size: int, prompt_tokens: int, response_tokens: int) -> bytes:
    rng = random.Random(0)
    trajectories = [
        Trajectory.from_lists(
            prompt_ids=[rng.randrange(150_000) for _ in range(prompt_tokens)],
            response_ids=[rng.randrange(150_000) for _ in range(response_tokens)],
            behavior_logprobs=[-rng.random() * 5 for _ in range(response_tokens)],
            token_versions=[0] * response_tokens,
            reward=float(i % 2),
            finish_reason="stop",
            generator_id=0,
        )
        for i in range(group_size)
    ]
    now = time.time()
    group = TrajectoryGroup(ID_PLACEHOLDER.decode(), "prompt", trajectories, now, now)
    return msgspec.msgpack.encode(group)


def frame_with_id(template: bytes, producer: int, seq: int) -> bytes:
    return template.replace(ID_PLACEHOLDER, f"{producer:04d}{seq:020d}".encode(), 1)


def producer(endpoints: list[str], template: bytes, index: int, count: int, start) -> None:
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, -1)  # deliver everything before exiting
    for endpoint in endpoints:
        push.connect(endpoint)  # PUSH round-robins over its connections
    frames = (frame_with_id(template, index, seq) for seq in range(count))
    start.wait()
    for frame in frames:
        push.send(frame, copy=False)
    push.close()
    ctx.term()


class Shards:
    """S shard processes (``shard_main``) with a DEALER each for stats."""

    def __init__(self, n: int, config: dict, log_dir: Path | None) -> None:
        self.procs, self.endpoints = [], []
        for i in range(n):
            cmd = [sys.executable, "-m", "streamrl.buffers.shard_main", "--shard-id", str(i)]
            cmd += ["--config", json.dumps(config)]
            if log_dir is not None:
                cmd += ["--log-dir", str(log_dir)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            self.procs.append(proc)
            self.endpoints.append(json.loads(proc.stdout.readline()))
        self.ctx = zmq.Context()
        self.dealers = []
        for ep in self.endpoints:
            dealer = self.ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(ep["requests"])
            self.dealers.append(dealer)
        self.decoder = msgspec.msgpack.Decoder(ShardStats)

    def stats(self) -> list[ShardStats]:
        for dealer in self.dealers:
            dealer.send(msgspec.msgpack.encode(StatsRequest()))
        return [self.decoder.decode(dealer.recv()) for dealer in self.dealers]

    def close(self) -> None:
        for dealer in self.dealers:
            dealer.close()
        self.ctx.term()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(30)


def bench_ingest(args, template: bytes, n_shards: int, durable: bool, tmp: Path) -> float:
    log_dir = tmp / f"ingest-{n_shards}-{int(durable)}"
    config = {"capacity": args.capacity, "durable": durable, "ingest_hwm": 100}
    shards = Shards(n_shards, config, log_dir)
    try:
        ctx = mp.get_context("spawn")
        start = ctx.Event()
        per = args.groups // args.producers
        total = per * args.producers
        ingest_eps = [ep["ingest"] for ep in shards.endpoints]
        procs = [
            ctx.Process(target=producer, args=(ingest_eps, template, i, per, start))
            for i in range(args.producers)
        ]
        for p in procs:
            p.start()
        time.sleep(1.0)  # connected, frames being prepared lazily
        t0 = time.perf_counter()
        start.set()
        deadline = t0 + 300
        while sum(s.ingested for s in shards.stats()) < total:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"only {shards.stats()} after 300s")
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.join(30)
        final = shards.stats()
        bad = sum(s.malformed for s in final)
        assert bad == 0, final
        return total * args.group_size / elapsed
    finally:
        shards.close()
        shutil.rmtree(log_dir, ignore_errors=True)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def bench_fetch(args, template: bytes, n_shards: int, tmp: Path) -> tuple[list, list]:
    config = {"capacity": args.capacity, "durable": False}
    shards = Shards(n_shards, config, None)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    for ep in shards.endpoints:
        push.connect(ep["ingest"])
    client = BufferClient([ep["requests"] for ep in shards.endpoints], ctx=ctx)
    raw = ctx.socket(zmq.DEALER)
    raw.connect(shards.endpoints[0]["requests"])
    raw_decoder = msgspec.msgpack.Decoder(RawBatch)
    k, per_round = args.fetch_groups, 10
    fetch_ms, raw_ms, seq = [], [], 0
    try:
        for _ in range(args.fetch_rounds):
            need = k * per_round * (2 if n_shards == 1 else 1)
            have = sum(s.size for s in shards.stats())
            for _ in range(max(0, need - have)):
                push.send(frame_with_id(template, 9999, seq))
                seq += 1
            while sum(s.size for s in shards.stats()) < need:
                time.sleep(0.01)
            for _ in range(per_round):
                t = time.perf_counter()
                groups = client.fetch(k, 0, 0, timeout_s=30)
                fetch_ms.append((time.perf_counter() - t) * 1e3)
                assert len(groups) == k
                if n_shards == 1:
                    t = time.perf_counter()
                    raw.send(msgspec.msgpack.encode(BatchRequest(seq, k, 0, 0, 0)))
                    reply = raw_decoder.decode(raw.recv())
                    raw_ms.append((time.perf_counter() - t) * 1e3)
                    assert len(reply.groups) == k
    finally:
        client.close()
        push.close(linger=0)
        raw.close(linger=0)
        ctx.term()
        shards.close()
    return fetch_ms, raw_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--groups", type=int, default=6000, help="groups per ingest run")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--response-tokens", type=int, default=768)
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--fetch-groups", type=int, default=32, help="groups per fetch")
    parser.add_argument("--fetch-rounds", type=int, default=20, help="10 fetches per round")
    parser.add_argument("--tmp", type=Path, default=None, help="where the logs go")
    parser.add_argument("--skip-ingest", action="store_true")
    args = parser.parse_args()

    template = template_frame(args.group_size, args.prompt_tokens, args.response_tokens)
    tokens = args.prompt_tokens + args.response_tokens
    print(
        f"buffer benchmark: groups of {args.group_size} trajectories x {tokens} tokens "
        f"({len(template) / 1e3:.0f} kB/frame), {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="streamrl-bench-", dir=args.tmp))
    try:
        if not args.skip_ingest:
            print(f"\ningest ({args.groups} groups from {args.producers} producer processes)")
            print(f"{'shards':>6} {'log':>4} {'traj/s':>10} {'traj/s/shard':>13}")
            for n_shards in sorted({1, args.shards}):
                for durable in (False, True):
                    rate = bench_ingest(args, template, n_shards, durable, tmp)
                    log_flag = "on" if durable else "off"
                    print(f"{n_shards:>6} {log_flag:>4} {rate:>10,.0f} {rate / n_shards:>13,.0f}")
        batch_traj = args.fetch_groups * args.group_size
        print(f"\nfetch of {args.fetch_groups} groups ({batch_traj} trajectories), ms")
        print(f"{'shards':>6} {'what':<34} {'p50':>7} {'p99':>7} {'n':>5}")
        for n_shards in sorted({1, args.shards}):
            fetch_ms, raw_ms = bench_fetch(args, template, n_shards, tmp)
            rows = [("BufferClient.fetch (decoded)", fetch_ms)]
            if raw_ms:
                rows.append(("shard round trip (not decoded)", raw_ms))
            for what, xs in rows:
                print(
                    f"{n_shards:>6} {what:<34} {percentile(xs, 50):>7.2f} "
                    f"{percentile(xs, 99):>7.2f} {len(xs):>5}"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
