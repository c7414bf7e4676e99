"""Take receipts outlive their shard's process (``buffers.receipts``)."""

from __future__ import annotations

from streamrl.buffers.receipts import Receipts
from streamrl.protocol import TakeReceipt


def test_receipts_come_back_after_a_restart_and_prune_to_the_newest_checkpoint(tmp_path):
    path = tmp_path / "receipts.jsonl"
    receipts = Receipts(path)
    for step in (3, 4, 5):
        receipts.add(TakeReceipt(0, step, [step * 10, step * 10 + 1]))
    receipts.prune(0, checkpointed=3)  # step 3's batch is in the checkpoint
    receipts.add(TakeReceipt(0, 6, [-1]))
    with open(path, "a") as f:
        f.write("[0, 7, [70")  # a line cut short by a crash mid-append
    again = Receipts(path)  # the shard's next process
    assert [(r.epoch, r.step, r.prompt_indices) for r in again.items] == [
        (0, 4, [40, 41]),
        (0, 5, [50, 51]),
        (0, 6, [-1]),
    ]
    again.prune(1, checkpointed=4)  # the new epoch's first take: the old epoch's are done
    assert again.items == [] and Receipts(path).items == []


def test_receipts_stay_bounded_and_memory_only_without_a_path(tmp_path):
    receipts = Receipts(None, max_kept=4)
    for step in range(10):
        receipts.add(TakeReceipt(0, step, [step]))
    assert len(receipts.items) <= 5 and receipts.items[-1].step == 9
    bounded = Receipts(tmp_path / "r.jsonl", max_kept=4)
    for step in range(12):
        bounded.add(TakeReceipt(0, step, [step]))
    assert [r.step for r in Receipts(tmp_path / "r.jsonl", max_kept=4).items] == [8, 9, 10, 11]


def test_past_the_cap_the_file_is_rewritten_once_per_quarter_of_it(tmp_path, monkeypatch):
    """A learner that stopped checkpointing: its receipts reach the cap, and from then on a
    take must not rewrite the file (two fsyncs on the shard's event loop) every time."""
    receipts = Receipts(tmp_path / "r.jsonl", max_kept=400)
    rewrites = []
    monkeypatch.setattr(receipts, "_rewrite", lambda: rewrites.append(len(receipts.items)))
    for step in range(1400):
        receipts.add(TakeReceipt(0, step, [step]))
    assert 0 < len(rewrites) <= 1000 // 100 and len(receipts.items) <= 500
