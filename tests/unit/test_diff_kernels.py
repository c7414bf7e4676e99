"""The compiled sparse diff against the codec's numpy reference of the same format, and the
compiled apply and undo against fancy indexing.

References: ``encode_positions`` (the format written in numpy) and plain
fancy indexing (which elements changed, what they hold). Both passes (``vectors``: 32 elements
a step, or 64-bit words) on every machine: the vector pass is correct on any target and only
slow on some. Blocks of every length modulo 4 and 32 and at every alignment, so the scalar
head and tail around the words and vectors and the vector steps that cross a window are
exercised.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamrl.workers.diff_kernels import apply_sparse, sparse_diff, undo_sparse
from streamrl.workers.sparse_index import encode_positions

PASSES = pytest.mark.parametrize("vectors", [True, False], ids=["vectors", "words"])


def pair(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    old = rng.integers(-(2**15), 2**15, n, dtype=np.int16)
    new = old.copy()
    where = rng.random(n) < fraction
    new[where] ^= rng.integers(1, 2**15, int(where.sum()), dtype=np.int16)  # any bit, sign too
    return new, old


@PASSES
@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 31, 32, 33, 254, 255, 256, 287, 1021, 70_001])
@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.3, 1.0])
def test_the_diff_is_the_reference_format(n: int, fraction: float, vectors: bool) -> None:
    new, old = pair(n, fraction, seed=n)
    index, values = sparse_diff(new, old, limit=n, vectors=vectors)
    positions = np.flatnonzero(new != old)
    assert index.tobytes() == encode_positions(positions, n)
    np.testing.assert_array_equal(values, new[positions])


@PASSES
@pytest.mark.parametrize(("skip_new", "skip_old"), [(0, 0), (1, 1), (3, 3), (1, 2), (2, 0)])
def test_any_alignment_of_either_image(skip_new: int, skip_old: int, vectors: bool) -> None:
    """Blocks are row ranges of a larger image, so they start anywhere; when the two images
    are not aligned alike the word pass compares element by element (the vector pass loads
    unaligned either way) and must agree."""
    new_all, old_all = pair(10_007, 0.05, seed=7)
    new, old = new_all[skip_new : skip_new + 9_000], old_all[skip_old : skip_old + 9_000]
    index, values = sparse_diff(new, old, limit=9_000, vectors=vectors)
    positions = np.flatnonzero(new != old)
    assert index.tobytes() == encode_positions(positions, 9_000)
    np.testing.assert_array_equal(values, new[positions])


@PASSES
@pytest.mark.parametrize("n", [4_000, 4_001])  # the limit crossed in a vector step, or the tail
def test_more_changes_than_the_limit_give_none(n: int, vectors: bool) -> None:
    new, old = pair(n, 0.1, seed=3)
    if n % 32:
        new[-1] = old[-1] + 1  # the last change in the scalar tail
    changes = int((new != old).sum())
    assert sparse_diff(new, old, limit=changes - 1, vectors=vectors) is None
    index, values = sparse_diff(new, old, limit=changes, vectors=vectors)
    assert values.size == changes
    assert sparse_diff(new, old, limit=0, vectors=vectors) is None
    unchanged = sparse_diff(old, old.copy(), limit=0, vectors=vectors)
    assert unchanged is not None and unchanged[1].size == 0


@PASSES
def test_a_dense_window_counts_to_255(vectors: bool) -> None:
    """Every element of a 255-element window changed: its count is the byte's largest value,
    and the vector steps that straddle it split their lanes between two windows."""
    new, old = pair(1_000, 0.0, seed=5)
    new[255:510] += 1
    index, values = sparse_diff(new, old, limit=1_000, vectors=vectors)
    assert list(index[:4]) == [0, 255, 0, 0]
    assert index[4:].tolist() == list(range(255))
    np.testing.assert_array_equal(values, new[255:510])


def test_the_vector_pass_is_chosen_only_where_numba_targets_avx2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without AVX2 LLVM compresses lane by lane and the vectors lose to the word loop."""
    import llvmlite.binding
    import numba

    from streamrl.workers.diff_kernels import _vectors_pay

    monkeypatch.setattr(numba.config, "CPU_NAME", "generic")
    assert not _vectors_pay()
    monkeypatch.setattr(numba.config, "CPU_NAME", None)
    monkeypatch.setattr(numba.config, "CPU_FEATURES", None)
    host = llvmlite.binding.get_host_cpu_features().flatten().split(",")
    x86 = llvmlite.binding.get_process_triple().startswith("x86_64")
    assert _vectors_pay() == (x86 and "+avx2" in host)
    monkeypatch.setattr(numba.config, "CPU_NAME", "haswell")
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+avx,-avx2")
    assert not _vectors_pay()
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+avx,+avx2")
    assert _vectors_pay() == x86
    monkeypatch.setattr(llvmlite.binding, "llvm_version_info", (15, 0, 7))  # no vector.compress
    assert not _vectors_pay()


# What numba compiles for on an AVX2-only x86 CPU: ``NUMBA_CPU_NAME`` alone keeps the host's
# features, AVX-512 included, so an emulation names the features too.
AVX2_ONLY = {
    "NUMBA_CPU_NAME": "haswell",
    "NUMBA_CPU_FEATURES": "+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+lzcnt,+movbe,"
    "+popcnt,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3",
}

_SHUFFLED = """
import numpy as np
from streamrl.workers import diff_kernels
from streamrl.workers.sparse_index import encode_positions
assert diff_kernels.VECTORS and not diff_kernels.NATIVE_COMPRESS
rng = np.random.default_rng(0)
for n in (31, 255, 256, 1021, 70_001):
    for fraction in (0.0, 0.02, 0.3, 1.0):
        old = rng.integers(-(2**15), 2**15, n, dtype=np.int16)
        new = old.copy()
        where = rng.random(n) < fraction
        new[where] ^= rng.integers(1, 2**15, int(where.sum()), dtype=np.int16)
        masters = rng.standard_normal(n).astype(np.float32)
        for source in (None, masters):
            a, b = new.copy(), new.copy()
            got = diff_kernels.sparse_diff(a, old, n, source=source)
            want = diff_kernels.sparse_diff(b, old, n, source=source, vectors=False)
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
        positions = np.flatnonzero(new != old)
        index, values = diff_kernels.sparse_diff(new, old, n)
        assert index.tobytes() == encode_positions(positions, n)
        np.testing.assert_array_equal(values, new[positions])
print("ok")
"""


@pytest.mark.skipif(
    not __import__("llvmlite").binding.get_process_triple().startswith("x86_64"),
    reason="x86 feature names",
)
def test_the_vector_pass_packs_by_table_where_the_cpu_has_no_compress(tmp_path) -> None:
    """As numba compiles for an AVX2-only CPU (``_shuffle_compress``), on any x86 host: the
    same bytes as the word loop, with and without masters to cast."""
    import os
    import subprocess
    import sys

    env = {**os.environ, **AVX2_ONLY, "NUMBA_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", _SHUFFLED], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


def test_the_benchmark_prints_both_passes() -> None:
    """``benchmarks/diff_kernels.py`` at a toy size: it checks the passes agree and tables them."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    args = ["--elements", "20000", "--densities", "0.01,0.5", "--reps", "1"]
    proc = subprocess.run(
        [sys.executable, "benchmarks/diff_kernels.py", *args],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "default pass here:" in proc.stdout
    assert [line.split("|")[1].strip() for line in proc.stdout.splitlines()[-2:]] == ["1%", "50%"]


@pytest.mark.parametrize("n", [1, 254, 255, 256, 1021, 70_001])
@pytest.mark.parametrize("fraction", [0.0, 0.02, 1.0])
def test_apply_writes_what_fancy_indexing_does_and_undo_puts_it_back(n, fraction) -> None:
    new, old = pair(n, fraction, seed=n + 1)
    positions = np.flatnonzero(new != old)
    index = np.frombuffer(encode_positions(positions, n), dtype=np.uint8)
    block = old.copy()
    kept = apply_sparse(index, new[positions], block)
    np.testing.assert_array_equal(block, new)
    np.testing.assert_array_equal(kept, old[positions])
    undo_sparse(index, kept, block)
    np.testing.assert_array_equal(block, old)


def test_an_index_that_does_not_fit_is_refused_before_anything_is_written() -> None:
    index = np.frombuffer(encode_positions(np.array([3, 300, 599]), 600), dtype=np.uint8)
    values = np.array([-1, -2, -3], dtype=np.int16)
    cases = {  # (index, values, block size)
        "too short for its windows": (index[:2], values, 600),
        "a count without its offset": (index[:-1], values, 600),
        "a position past the block": (index, values, 591),
        "an offset of 255": (np.array([1, 0, 0, 255], dtype=np.uint8), values[:1], 600),
        "fewer values than positions": (index, values[:2], 600),
    }
    for name, (bad, some, size) in cases.items():
        block = np.arange(size, dtype=np.int16)
        with pytest.raises(ValueError):
            apply_sparse(bad, some, block)
        np.testing.assert_array_equal(block, np.arange(size, dtype=np.int16), err_msg=name)


def test_undo_of_a_position_named_twice_restores_its_first_value() -> None:
    block = np.arange(300, dtype=np.int16)
    index = np.array([2, 0, 7, 7], dtype=np.uint8)  # window 0 names offset 7 twice
    kept = apply_sparse(index, np.array([-1, -2], dtype=np.int16), block)
    assert block[7] == -2
    undo_sparse(index, kept, block)
    np.testing.assert_array_equal(block, np.arange(300, dtype=np.int16))


# Float32 values whose bf16 rounding is a corner: NaNs (both signs), infinities, zeros of both
# signs, denormals, the largest finite values (one rounds to infinity), ties to even both ways.
CORNERS = [
    float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40,
    1.1754942e-38, 3.4e38, -3.4e38, 3.3895314e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8,
]  # fmt: skip


@PASSES
@pytest.mark.parametrize("n", [0, 1, 14, 31, 32, 33, 255, 1021, 70_001])
@pytest.mark.parametrize("fraction", [0.0, 0.03, 1.0])
def test_a_diff_from_float32_masters_writes_torchs_rounding_in_the_same_pass(
    n: int, fraction: float, vectors: bool
) -> None:
    """``source``: ``new`` is written as torch's bf16 rounding of the masters, and the diff is
    the one of that image; past ``limit`` the image is still written whole."""
    import torch

    rng = np.random.default_rng(n)
    masters = torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 0.02)
    masters[: min(n, len(CORNERS))] = torch.tensor(CORNERS[:n])
    reference = masters.to(torch.bfloat16).view(torch.int16).numpy()
    # A NaN's bits are the kernel's choice: 0xFFFF from torch's vector kernels (AVX2,
    # AVX-512) as from ours, 0x7FC0 from its scalar one (ATEN_CPU_CAPABILITY=default).
    nan = torch.isnan(masters).numpy()
    old = reference.copy()
    flip = rng.random(n) < fraction
    old[flip] ^= rng.integers(1, 2**15, int(flip.sum()), dtype=np.int16)
    new = np.zeros(n, np.int16)
    found = sparse_diff(new, old, limit=n, source=masters.numpy(), vectors=vectors)
    np.testing.assert_array_equal(new[~nan], reference[~nan])
    assert torch.from_numpy(new[nan]).view(torch.bfloat16).isnan().all()
    expected = sparse_diff(new.copy(), old, limit=n, vectors=vectors)
    assert found is not None and expected is not None
    np.testing.assert_array_equal(found[0], expected[0])
    np.testing.assert_array_equal(found[1], expected[1])
    if int(flip.sum()) > 0:
        over = np.zeros(n, np.int16)
        assert sparse_diff(over, old, limit=0, source=masters.numpy(), vectors=vectors) is None
        np.testing.assert_array_equal(over[~nan], reference[~nan])


def test_a_source_that_is_not_the_blocks_float32_masters_is_refused() -> None:
    new = np.zeros(64, np.int16)
    with pytest.raises(ValueError, match="source"):
        sparse_diff(new, new.copy(), limit=64, source=np.zeros(64, np.float64))
    with pytest.raises(ValueError, match="source"):
        sparse_diff(new, new.copy(), limit=64, source=np.zeros(63, np.float32))
