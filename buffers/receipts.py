"""Take receipts: what each take since the learners' newest checkpoint handed out.

A shard writes one ``TakeReceipt`` (learner epoch, the step the batch trains, its groups'
prompt indices) per take that handed out groups. When the learner group restarts from a
checkpoint, the controller reads the receipts of the dead epoch after it: exactly those groups
return to the budget and their prompts are handed out again (docs/design.md §6), whether or not
the learner's own report of the take ever left.

A durable shard keeps them in ``receipts.jsonl`` beside its log (one line per take, appended;
rewritten whole when the learners' newest checkpoint makes old ones useless), so a shard that
restarts in the same incident as the learner group still knows them. Bounded by ``max_kept``
(plus a quarter, trimmed in one rewrite). Before the learners' first checkpoint a shard keeps
none: no restart could roll back to one, and a resume without one starts over.

Example::

    receipts = Receipts(shard_dir / "receipts.jsonl")
    receipts.add(TakeReceipt(epoch=0, step=5, prompt_indices=[3, 4]))
    receipts.prune(epoch=0, checkpointed=4)   # keeps step 5: after the checkpoint
    receipts.prune(epoch=1, checkpointed=4)   # a new epoch's first take: epoch 0's go
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from streamrl.files import atomic_write_text
from streamrl.protocol import TakeReceipt

log = logging.getLogger(__name__)


class Receipts:
    def __init__(self, path: Path | None = None, max_kept: int = 4096) -> None:
        self.path, self.max_kept = path, max_kept
        self.items: list[TakeReceipt] = self._load() if path is not None else []

    def add(self, receipt: TakeReceipt) -> None:
        self.items.append(receipt)
        if len(self.items) > self.max_kept + self.max_kept // 4:
            # Over the cap by a quarter: trim to it with one rewrite, so that a learner that
            # stops checkpointing costs one rewrite per max_kept / 4 takes, not one per take.
            del self.items[: -self.max_kept]
            self._rewrite()
        elif self.path is not None:
            with open(self.path, "a") as f:  # survives the process (not the machine)
                f.write(_line(receipt))

    def prune(self, epoch: int, checkpointed: int) -> None:
        """The learner group of ``epoch`` has its newest checkpoint at ``checkpointed``:
        receipts of older epochs or earlier steps can never be needed again."""
        keep = [r for r in self.items if r.epoch == epoch and r.step > checkpointed]
        if len(keep) != len(self.items):
            self.items = keep
            self._rewrite()

    def _rewrite(self) -> None:
        if self.path is not None:
            atomic_write_text(self.path, "".join(map(_line, self.items)))

    def _load(self) -> list[TakeReceipt]:
        assert self.path is not None
        if not self.path.is_file():
            return []
        items = []
        for line in self.path.read_text().splitlines():
            try:  # a line cut short by a crash mid-append is the only one that can be bad
                epoch, step, indices = json.loads(line)
                items.append(TakeReceipt(int(epoch), int(step), [int(i) for i in indices]))
            except (ValueError, TypeError):
                log.warning("%s: skipped an unreadable receipt line", self.path)
        return items[-self.max_kept :]


def _line(receipt: TakeReceipt) -> str:
    return json.dumps([receipt.epoch, receipt.step, receipt.prompt_indices]) + "\n"
