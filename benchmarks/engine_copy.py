"""The engine's side of a version: what it costs to bring an engine's own copy of the weights
(fp32 on an AVX2 CPU, a GPU's) to a new bf16 image, by each way the HF engine can.

    python benchmarks/engine_copy.py                 # SmolLM2-135M's shapes, fp32, this CPU
    python benchmarks/engine_copy.py --device cuda   # the copy on a GPU
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 NUMBA_CPU_NAME=haswell \\
    NUMBA_CPU_FEATURES=+avx,+avx2,+bmi,+bmi2,+fma,+f16c,+popcnt,+sse4.2,+ssse3 \\
        python benchmarks/engine_copy.py             # an AVX2 CPU, as emulated

Per share of elements changed a version (random positions, as a diff's are), the medians over
``--repeats`` versions on one thread:
  new tensors   each parameter made anew from the image (``tensor.to(dtype, copy=True)``):
                what the engine did before ``SpareCopies``; includes the new memory's faults
  spare copy    one streaming copy of the image into a kept spare (``copy_``)
  spare scatter the last version's and this version's positions written into the spare
                (``diff_kernels.copy_at``), what ``SpareCopies`` does below ``SCATTER_SHARE``
  in place      this version's positions written into the live copy: what an adoption
                between decode steps would cost if there were no spare
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from streamrl.hardware import cpu_description
from streamrl.workers.diff_kernels import compile_kernels
from streamrl.workers.engines.spare_copies import SCATTER_SHARE, write_at

# SmolLM2-135M: the tied embedding, then per layer q, k, v, o, gate, up, down (30 layers).
SHAPES = [(49152, 576)] + [
    (576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)
] * 30  # fmt: skip


def timed(fn, device: str) -> float:
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--shares", default="0.005,0.01,0.025,0.05")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    compile_kernels(encode=False)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    image = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in SHAPES]
    live = [t.to(args.device, dtype) for t in image]
    spare = [t.to(args.device, dtype) for t in image]
    numel = sum(t.numel() for t in image)
    print(
        f"# {cpu_description()}, torch {torch.__version__}, "
        f"{args.device} {args.dtype}, {numel / 1e6:.0f}M elements, one thread; "
        f"SCATTER_SHARE {SCATTER_SHARE}"
    )
    print("changed | new tensors | spare copy | spare scatter | in place   (ms, median)")
    rng = np.random.default_rng(0)
    for share in [float(s) for s in args.shares.split(",")]:
        rows: dict[str, list[float]] = {k: [] for k in ("new", "copy", "scatter", "place")}
        for _ in range(args.repeats):
            last = [np.flatnonzero(rng.random(t.numel()) < share) for t in image]
            now = [np.flatnonzero(rng.random(t.numel()) < share) for t in image]
            for key, seconds in one_version(image, live, spare, last, now, args.device, dtype):
                rows[key].append(seconds)
        cells = [f"{1e3 * statistics.median(v):8.0f}" for v in rows.values()]
        print(f"{share:7.3f} | " + " | ".join(cells))


def one_version(image, live, spare, last, now, device, dtype) -> list[tuple[str, float]]:
    """Seconds each way takes for one version (``last``/``now``: per tensor, the positions
    the previous version and this one changed)."""

    def new() -> None:
        for t in image:
            t.to(device, dtype, copy=True)

    def copy() -> None:
        for s, t in zip(spare, image, strict=True):
            s.copy_(t)

    def scatter() -> None:
        for a, b, s, t in zip(last, now, spare, image, strict=True):
            write_at(a, t, s)
            write_at(b, t, s)

    def place() -> None:
        for b, s, t in zip(now, live, image, strict=True):
            write_at(b, t, s)

    return [
        (k, timed(f, device))
        for k, f in (("new", new), ("copy", copy), ("scatter", scatter), ("place", place))
    ]


if __name__ == "__main__":
    main()
