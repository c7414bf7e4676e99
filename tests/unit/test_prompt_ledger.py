"""Resume continues the prompt stream from the checkpointed model: no prompt skipped or twice."""

from __future__ import annotations

import json

from streamrl.controller.state import PromptLedger, load_prompt_ledger


def test_a_roll_back_hands_the_lost_steps_prompts_out_first() -> None:
    ledger = PromptLedger()
    ledger.grant(0, 8)  # 0..7
    for pushed in range(1, 9):
        ledger.delivered(0, pushed)
    ledger.taken(1, [0, 1])
    ledger.taken(2, [2])
    ledger.taken(2, [3])  # the other rank's share
    ledger.checkpointed(2)  # saved: steps 1 and 2 need no record any more
    ledger.taken(3, [5, 4])
    ledger.taken(4, [6, -1])  # -1: a group from no stream index
    assert ledger.trained == {3: [5, 4], 4: [6]}
    assert ledger.roll_back(2) == [4, 5, 6]
    assert ledger.trained == {}
    assert ledger.grant(1, 5) == [4, 5, 6, 8, 9]  # 7 is in the buffer, not lost: not again


def test_a_resumed_run_continues_from_its_checkpoint_not_the_newest_step(tmp_path) -> None:
    ledger = PromptLedger()
    ledger.grant(0, 6)
    ledger.delivered(0, 4)  # 4, 5 in flight when the run ended
    ledger.taken(1, [0, 1])
    ledger.checkpointed(1)
    ledger.taken(2, [2, 3])
    (tmp_path / "prompts.json").write_text(json.dumps(ledger.snapshot()))
    resumed = load_prompt_ledger(tmp_path, version=1)
    assert resumed.grant(0, 5) == [2, 3, 4, 5, 6]
    at_newest = load_prompt_ledger(tmp_path, version=2)
    assert at_newest.grant(0, 3) == [4, 5, 6]
    assert load_prompt_ledger(tmp_path / "none", version=3).grant(0, 1) == [0]


def test_an_absurd_pushed_count_delivers_what_is_owed_at_once() -> None:
    """A malformed report's ``groups_pushed`` (2**62) delivers the grants outstanding and
    returns: it once counted to it, and the controller's loop hung."""
    ledger = PromptLedger()
    ledger.grant(0, 3)
    ledger.delivered(0, 2**62)
    assert not ledger.outstanding[0] and len(ledger.reported[0]) == 3
