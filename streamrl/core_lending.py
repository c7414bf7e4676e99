"""Cores lent while a role waits: on one host, a working role process runs on its own threads
plus a share of those of the role processes that are waiting (docs/design.md §6).

Why: every CPU role process gets an even share of the cores (``streamrl.cores``), and
whichever side waits leaves its share idle. In the default job on 2 cores (AMD EPYC, AVX2 fp32,
seed 0) the learner waited 394 s of a 13:50 run for batches while the generator decoded on
one thread; in the learner-bound stretches the generator waits for admission while the
learner trains on one thread.

How: in local mode the controller makes one small file per run, the *board*, with a slot per
CPU role process (learner rank r: slot r; generator g: the slot after the learner ranks').
Each process maps it and writes its own slot: its thread count, and whether it is waiting.
A working process looks at the board between units of work tens of milliseconds apart (each
decoder block of the learner's forward and backward, each decode step of the generator) and
runs its own threads plus an equal share of the threads the waiting processes lend, the
working processes' own threads staying within the host's cores. A process clears its flag
before it works again, and the borrower gives the core back at its next look: the two share
a core for one unit of work at most.
Pinned roles (``placement.pin_cpus``) hold disjoint cores and lend nothing.

Example: a learner and a generator, one thread each, on 2 cores. The learner waits for a
batch: the generator's next decode step runs on 2 threads. The batch arrives: the learner
trains on its 1 thread at once, and the generator's next decode step is back on 1.

Stdlib only: the controller creates the board without importing torch.
"""

from __future__ import annotations

import contextlib
import mmap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SLOTS = 64  # role processes a board has room for; the ones past it lend and borrow nothing
_SLOT_BYTES = 2  # [own threads (0: slot unused), waiting flag]


def create_board(path: Path) -> None:
    """An empty board (every slot unused) at ``path``."""
    path.write_bytes(bytes(SLOTS * _SLOT_BYTES))


def board_slot(role: str, index: int, learner_ranks: int) -> int | None:
    """The slot of learner rank ``index`` or generator ``index``; None past the board's room
    (generators added live)."""
    slot = index if role == "learner" else learner_ranks + index
    return slot if slot < SLOTS else None


class CoreBoard:
    """One role process's view of the board: it marks itself waiting (``waiting``) and sets
    its thread count from the others' (``adjust``) through ``set_threads``; with
    ``set_threads=None`` it only lends (an engine whose thread count is fixed once built,
    e.g. vLLM's CPU backend)."""

    def __init__(
        self,
        path: str,
        slot: int,
        own_threads: int,
        host_cores: int,
        set_threads: Callable[[int], None] | None,
    ) -> None:
        self.slot, self.own, self.host_cores = slot, max(1, own_threads), max(1, host_cores)
        self.set_threads = set_threads
        self.current = self.own
        self._borrowed_s, self._since = 0.0, time.monotonic()
        self._file = open(path, "r+b")  # noqa: SIM115 - held for the map's lifetime
        self._map = mmap.mmap(self._file.fileno(), SLOTS * _SLOT_BYTES)
        self._map[slot * _SLOT_BYTES + 1] = 0
        self._map[slot * _SLOT_BYTES] = min(self.own, 255)

    def threads(self) -> int:
        """The threads this process may run now, while it works: its own, plus an equal
        share of the threads the waiting processes lend (the remainder to the working slots
        that come first), with the working processes' own threads within the host's."""
        lent, own_working, working = 0, 0, []
        board = self._map[:]
        for s in range(SLOTS):
            own, flag = board[s * _SLOT_BYTES], board[s * _SLOT_BYTES + 1]
            if s == self.slot:
                own, flag = self.own, 0
            if not own:
                continue
            if flag:
                lent += own
            else:
                own_working += own
                working.append(s)
        share, remainder = divmod(lent, len(working))
        extra = share + (working.index(self.slot) < remainder)
        return max(1, min(self.own + extra, self.host_cores - (own_working - self.own)))

    def adjust(self) -> None:
        """Take the threads ``threads`` says, if that changed since the last look."""
        if self.set_threads is None:
            return
        n = self.threads()
        if n != self.current:
            self.set_threads(n)
            self._borrowed_s = self.borrowed_s()
            self._since, self.current = time.monotonic(), n

    def borrowed_s(self) -> float:
        """Seconds this process has run on more threads than its own."""
        ongoing = time.monotonic() - self._since if self.current > self.own else 0.0
        return self._borrowed_s + ongoing

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Lend this process's threads for the block (it computes nothing meanwhile)."""
        self._map[self.slot * _SLOT_BYTES + 1] = 1
        try:
            yield
        finally:
            self._map[self.slot * _SLOT_BYTES + 1] = 0
            self.adjust()

    def close(self) -> None:
        """Leave the board: the slot lends and borrows nothing any more."""
        if self._map.closed:
            return
        self._map[self.slot * _SLOT_BYTES] = 0
        self._map[self.slot * _SLOT_BYTES + 1] = 0
        self._map.close()
        self._file.close()


def open_board(
    path: str | None,
    slot: int | None,
    own_threads: int,
    host_cores: int,
    set_threads: Callable[[int], None] | None,
) -> CoreBoard | None:
    """The role's board, or None where the controller made none (pinned roles, a cluster,
    ``placement.lend_idle_cores: false``, a role built directly)."""
    if path is None or slot is None:
        return None
    return CoreBoard(path, slot, own_threads, host_cores, set_threads)


@contextlib.contextmanager
def waiting_on(board: CoreBoard | None) -> Iterator[None]:
    """``board.waiting()``, or nothing without a board."""
    if board is None:
        yield
    else:
        with board.waiting():
            yield
