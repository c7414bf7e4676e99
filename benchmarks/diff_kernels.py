"""The weight codec's compiled passes per density: the encoder's compaction (vector pass
against word loop) and the subscriber's apply (compiled against numpy).

    python benchmarks/diff_kernels.py                          # 135M elements (SmolLM2-135M)
    NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx,+avx2,+bmi,+bmi2,+fma,+f16c,+popcnt,\
+sse4.2,+ssse3 python benchmarks/diff_kernels.py            # as numba compiles for AVX2 only

Synthetic images of ``--elements`` int16 values cut into 8M-element blocks (16 MiB of bf16,
the publisher's default chunk), random changes at each density; ``sparse_diff`` over every
block on one thread, best of ``--reps``, for both passes (``workers/diff_kernels.py``; they
write the same bytes, checked here too). Prints the CPU line, numba's target and which pass
this machine uses by default. Both images are read once per pass, so the vector pass's floor
is the memory's read speed; XXH3 of one image is printed beside it for scale (an apply
hashes every block it wrote too, on top of the figures here). Apply: the sparse parts the
vector pass wrote, applied to a copy of the old image by ``apply_sparse`` and by numpy's
decode, gather and scatter (``sparse_index.decode_positions``), the results compared.
"""

from __future__ import annotations

import argparse
import time

import llvmlite.binding
import numba
import numpy as np
import xxhash

from streamrl.hardware import cpu_description
from streamrl.workers.diff_kernels import VECTORS, apply_sparse, compile_kernels, sparse_diff
from streamrl.workers.sparse_index import decode_positions

BLOCK = 8 * 1024 * 1024


def best_of(reps: int, work, *args) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        work(*args)
        times.append(time.perf_counter() - start)
    return min(times)


def diff_all(blocks: list[tuple[np.ndarray, np.ndarray]], vectors: bool) -> list:
    return [sparse_diff(n, o, limit=n.size // 2, vectors=vectors) for n, o in blocks]


def apply_all(parts: list, images: list[np.ndarray], compiled: bool) -> None:
    for (index, values), image in zip(parts, images, strict=True):
        if compiled:
            apply_sparse(index, values, image)
        else:
            positions = decode_positions(index, image.size)
            _kept = image[positions]
            image[positions] = values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=135_000_000)
    parser.add_argument("--densities", default="0.005,0.023,0.1")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    compile_kernels()
    for vectors in (True, False):  # both compiled before anything is timed
        sparse_diff(np.zeros(99, np.int16), np.ones(99, np.int16), limit=99, vectors=vectors)
    target = numba.config.CPU_NAME or llvmlite.binding.get_host_cpu_name()
    print(
        f"# {cpu_description()}; numba {numba.__version__} for {target}, "
        f"LLVM {'.'.join(map(str, llvmlite.binding.llvm_version_info))}; "
        f"default pass here: {'vectors' if VECTORS else 'words'}"
    )
    rng = np.random.default_rng(0)
    old = rng.integers(-(2**15), 2**15, args.elements, dtype=np.int16)
    starts = range(0, args.elements, BLOCK)
    hash_s = best_of(
        args.reps, lambda: [xxhash.xxh3_64_intdigest(old[a : a + BLOCK]) for a in starts]
    )
    print(f"XXH3 of one image: {1000 * hash_s:.1f} ms")
    print("| changed | words ms | vectors ms | words / vectors | apply numpy ms | apply ms |")
    print("|---|---|---|---|---|---|")
    for density in (float(d) for d in args.densities.split(",")):
        new = old.copy()
        new[rng.random(args.elements) < density] ^= 1
        blocks = [(new[a : a + BLOCK], old[a : a + BLOCK]) for a in starts]

        for (i_w, v_w), (i_v, v_v) in zip(
            diff_all(blocks, False), diff_all(blocks, True), strict=True
        ):
            if not (np.array_equal(i_w, i_v) and np.array_equal(v_w, v_v)):
                raise SystemExit("the two passes wrote different bytes")
        words = best_of(args.reps, diff_all, blocks, False)
        vectors = best_of(args.reps, diff_all, blocks, True)
        parts = [sparse_diff(n, o, limit=n.size) for n, o in blocks]  # none left out
        applied = {}
        for compiled in (False, True):
            images = [o.copy() for _, o in blocks]
            # Each rep writes the same values again: the same positions and cache lines.
            applied[compiled] = best_of(args.reps, apply_all, parts, images, compiled)
            if not all(np.array_equal(i, n) for i, (n, _) in zip(images, blocks, strict=True)):
                raise SystemExit("an apply did not reproduce the new image")
        print(
            f"| {100 * density:g}% | {1000 * words:.1f} | {1000 * vectors:.1f} | "
            f"{words / vectors:.2f}x | {1000 * applied[False]:.1f} | {1000 * applied[True]:.1f} |"
        )


if __name__ == "__main__":
    main()
