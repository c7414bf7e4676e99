"""The difficulty sampler (``controller.difficulty``) and the ledger's use of it: questions
whose groups all scored alike are asked less, owed prompts never skipped."""

from __future__ import annotations

from streamrl.config import load_config
from streamrl.controller.difficulty import DifficultySampler
from streamrl.controller.state import PromptLedger
from streamrl.protocol import GeneratorReport


def report(indices: list[int], flat: list[bool], total: int, incarnation: int = 0):
    return GeneratorReport(
        generator_id=0,
        applied_version=0,
        tokens_generated=0,
        groups_pushed=0,
        checksum_failures=0,
        anchors_applied=0,
        time=0.0,
        incarnation=incarnation,
        outcome_indices=indices,
        outcome_flat=flat,
        outcomes_total=total,
    )


def sampler(keep: float = 0.25) -> DifficultySampler:
    config = load_config(
        None, ["data.sampler=difficulty", f"data.difficulty_keep={keep}", "run.seed=3"]
    )
    made = DifficultySampler.of(config)
    assert made is not None
    return made


def test_uniform_has_no_sampler() -> None:
    assert DifficultySampler.of(load_config(None, [])) is None


def test_flat_questions_are_asked_at_the_keep_share_and_others_always() -> None:
    s = sampler(keep=0.25)
    flat = list(range(0, 400))
    s.take(report(flat, [True] * 400, 400))
    # Every question of those 400 indices is now flat (rate 1): kept ~25% of the time.
    kept = [s.keep(i) for i in flat]
    assert 0.15 < sum(kept) / len(kept) < 0.35
    assert s.skipped == len(kept) - sum(kept)
    # Same history, same coins: a rerun skips the same indices.
    again = sampler(keep=0.25)
    again.take(report(flat, [True] * 400, 400))
    assert [again.keep(i) for i in flat] == kept
    # A question never scored, or one whose groups varied, is always asked.
    fresh = sampler()
    fresh.take(report(flat, [False] * 400, 400))
    assert all(fresh.keep(i) for i in range(800))


def test_a_report_window_is_taken_once_and_a_lost_report_is_caught_up() -> None:
    s = sampler()
    s.take(report([1, 2], [True, False], 2))
    s.take(report([1, 2], [True, False], 2))  # the same snapshot again: nothing new
    assert s.scored == 2
    s.take(report([2, 3, 4, 5], [False, True, True, True], 5))  # one report was lost
    assert s.scored == 5
    s.take(report([7], [True], 1, incarnation=1))  # a replaced generator counts from 0
    assert s.scored == 6


def test_the_ledger_passes_over_fresh_indices_only() -> None:
    ledger = PromptLedger(next_index=10, retry=[3, 4])
    asked = ledger.grant(0, 4, keep=lambda index: index % 2 == 0)
    assert asked == [3, 4, 10, 12]  # owed 3 and 4 whatever keep says; 11 passed over
    assert ledger.next_index == 13
