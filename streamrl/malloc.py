"""Memory settings for role processes: the C allocator's, and the Python collector's
(torch-free: the buffer shard imports it)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import platform
import time

log = logging.getLogger(__name__)

# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of giving it back to the OS.

    A training step allocates and frees the same large buffers every time (FSDP2's all-gather
    and reduce-scatter buffers, activations, gradients). By default glibc serves blocks over
    128 KiB with fresh ``mmap`` pages and unmaps them on free, so every step faults
    every page in again: 37 ms to copy one SmolLM2 block's 3.5M parameters that take 0.8 ms
    when the pages are mapped, 2 s of a 7 s learner step on a 2-core VM (Intel Xeon, AVX512).
    With this, blocks up to 1 GiB come from the heap, which is trimmed only past 2 GiB free:
    that learner step takes 5.2 s, 1.12x a plain PyTorch loop's speed instead of 0.79x. The
    cost is resident memory the process keeps. Returns False where the C library is not
    glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)
    )


def defer_collections() -> None:
    """No automatic collection until ``freeze_startup_heap`` (called at a role's start).

    While a role imports torch and transformers and builds its model, Python runs a full
    collection each time the surviving objects grow by a quarter, and each walks the whole heap
    built so far: six to seven of 50-410 ms per role process on an Intel Xeon (0.8 s in a
    learner rank, 1.3 s in a generator), CPU that every role starting beside it on the same
    cores waits for. Setup's garbage is freed by reference counting as before; what cycles
    it leaves are collected once, by ``freeze_startup_heap``."""
    gc.disable()


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive into the collector's permanent generation
    (``gc.freeze``), as vLLM does after its engine starts, and collect automatically again
    (``defer_collections``); returns how many were frozen.

    Why: a role process holds ~0.4M tracked objects once torch, transformers and a model are
    loaded, and a full collection walks them all, the GIL held, so the weight thread and the
    compute stop alike wherever it lands. Python runs one whenever enough new objects have
    survived. In 25 steps of the default job (SmolLM2-135M, AMD EPYC) the learner ran two of
    252 and 273 ms and the generator one of 206 ms: one landed in a version's snapshot (0.29
    s against a median of 0.04) and the other held the generator's weight thread (publish ->
    applied 0.46 s against 0.28); docs/experiments.md, 2026-12-05 (session 15). Frozen
    objects are still freed by reference counting; only a reference cycle among them would
    now stay, and what setup built lives as long as the process. Call it once setup is
    done, before the role's loop."""
    gc.collect()
    gc.freeze()
    gc.enable()
    return gc.get_freeze_count()


class SlowCollections:
    """Logs each collection that takes at least ``threshold_s`` (its generation and time) and
    keeps their count and seconds, so a pause the collector caused is named in the role's log."""

    def __init__(self, threshold_s: float = 0.02) -> None:
        self.threshold_s = threshold_s
        self.count, self.seconds = 0, 0.0
        self._started = 0.0

    def install(self) -> SlowCollections:
        gc.callbacks.append(self._callback)
        return self

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        if took >= self.threshold_s:
            self.count += 1
            self.seconds += took
            log.info(
                "gc: generation %d collection took %.0f ms (%d collected)",
                info["generation"],
                1000 * took,
                info["collected"],
            )
