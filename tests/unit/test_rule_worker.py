"""Rule rewards under a time bound (``workers.generation.rule_worker``, issue 52): a rule that
hangs, raises or kills its process refuses its own group, counted, and the next group is scored;
the Python API's callables reach the worker; the generator's sampling pushes the refused
group marked ``unscored``. Real child processes, ended by the worker by pid."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import pytest

from streamrl import callables
from streamrl.config import RewardSpec, load_config
from streamrl.data import prompt_stream
from streamrl.models import TINY, load_tokenizer, resolve_model
from streamrl.rewards import CombinedReward, RewardInput
from streamrl.workers.engines.base import Engine, GenerationOutput
from streamrl.workers.generation.rule_worker import RuleWorker
from streamrl.workers.generation.sampling import Sampler

BOUND_S = 1.0


def _rule(kind: str, trigger: str) -> Callable[[RewardInput], float]:
    """A rule that pays 1 for every response but ``trigger``, on which it fails as ``kind``
    says. A closure, so cloudpickle sends it by value, as a notebook's function."""

    def reward(sample: RewardInput) -> float:
        if sample.response_text != trigger:
            return 1.0
        if kind == "sleep":
            time.sleep(3600)
        if kind == "regex":  # a C loop that holds the GIL: no thread could be abandoned
            re.match(r"(a+)+$", "a" * 40 + "b")
        if kind == "raise":
            raise ValueError("cannot read this one")
        if kind == "exit":
            os._exit(3)
        return 0.5

    return reward


def _register(fn: Callable) -> str:
    return callables.register([("reward", fn)])[id(fn)]


def _worker(fn: Callable, *more: RewardSpec, bound: float = BOUND_S) -> RuleWorker:
    name = _register(fn)
    # Only the blob its rules name, as a generator's spec carries (``callables.referenced``):
    # earlier tests' callables (their modules gone) stay out of it.
    return RuleWorker([RewardSpec(name=name), *more], {name: callables._BLOBS[name]}, bound)


def _group(*texts: str) -> list[RewardInput]:
    return [RewardInput(text, [1, 2], "7", prompt_text="What is 3 + 4?") for text in texts]


@pytest.mark.parametrize("kind", ["sleep", "regex"])
def test_a_rule_that_hangs_is_abandoned_within_its_bound_and_the_next_group_scored(
    kind: str,
) -> None:
    worker = _worker(_rule(kind, "hang"), RewardSpec(name="numeric_match"))
    try:
        worker.score([_group("7")])  # started and warm: the bound is what is measured
        started = time.monotonic()
        out = worker.score([_group("7", "8"), _group("7", "hang"), _group("8")])
        took = time.monotonic() - started
        assert out[0] == [[1.0, 1.0], [1.0, 0.0]] and out[2] == [[1.0, 0.0]]
        assert out[1] == f"rule rewards took over {BOUND_S:g} s scoring this group (abandoned)"
        assert BOUND_S <= took < BOUND_S + 5.0  # the bound, a restart, two groups scored
        figures = worker.figures
        assert (figures.timeouts, figures.errors, figures.restarts) == (1, 0, 1)
        assert worker.score([_group("7")]) == [[[1.0, 1.0]]]  # the new worker goes on
    finally:
        worker.close()


def test_a_rule_that_raises_refuses_its_group_with_the_reason() -> None:
    fn = _rule("raise", "bad")
    worker = _worker(fn)
    try:
        out = worker.score([_group("bad", "7"), _group("7")])
        name = callables.base_name(fn)
        assert out == [f"reward '{name}' raised ValueError: cannot read this one", [[1.0]]]
        assert (worker.figures.errors, worker.figures.timeouts, worker.figures.restarts) == (
            1,
            0,
            0,
        )
    finally:
        worker.close()


def test_a_rule_that_kills_its_worker_refuses_its_group_and_a_new_worker_goes_on() -> None:
    worker = _worker(_rule("exit", "die"))
    try:
        first = worker.process
        out = worker.score([_group("7"), _group("die"), _group("7")])
        assert out[0] == [[1.0]] and out[2] == [[1.0]]
        assert out[1] == "the rule worker exited (exit code 3) scoring this group"
        assert worker.figures.errors == 1 and worker.process is not first
        assert first is not None and first.returncode == 3
    finally:
        worker.close()


def test_closing_ends_the_worker_and_no_rule_needs_none() -> None:
    worker = _worker(_rule("sleep", "hang"))
    process = worker.process
    worker.close()
    assert process is not None and process.poll() is not None
    served = RewardSpec(model="runs/rm")
    empty = RuleWorker([served], {}, BOUND_S)  # every reward served: no process at all
    assert empty.process is None and empty.score([_group("a", "b")]) == [[[], []]]


def test_the_worker_costs_little_per_group() -> None:
    """The measured cost of the process boundary: 64 groups of 8 responses (one generation
    call of a large job) scored by two built-in rules in the worker and in this process."""
    specs = [RewardSpec(name="numeric_match"), RewardSpec(name="equation_form")]
    groups = [_group(*(f"3 + 4 = {7 + j % 2}" for j in range(8))) for _ in range(64)]
    worker = RuleWorker(specs, {}, BOUND_S)
    inline = CombinedReward(specs)
    try:
        expected = [[inline.checked_scores(s) for s in g] for g in groups]
        assert worker.score(groups) == expected  # the same scores either side
        rounds = 5
        started = time.perf_counter()
        for _ in range(rounds):
            worker.score(groups)
        in_worker = (time.perf_counter() - started) / rounds
        started = time.perf_counter()
        for _ in range(rounds):
            [[inline.checked_scores(s) for s in g] for g in groups]
        in_process = (time.perf_counter() - started) / rounds
    finally:
        worker.close()
    per_group_ms = (in_worker - in_process) / len(groups) * 1e3
    print(f"rule worker: {in_worker * 1e3:.1f} ms a call of 64 groups x 8 (in process "
          f"{in_process * 1e3:.1f} ms): {per_group_ms:.3f} ms a group more")  # fmt: skip
    assert per_group_ms < 5.0  # generous: a loaded 2-core machine; measured well below


# --------------------------------------------------------------------------- the sampler


class EchoEngine(Engine):
    """Answers prompt ``k`` of a call with ``answers[k // group size]``'s tokens."""

    def __init__(self, tokenizer, answers: list[str], group_size: int) -> None:
        self.tokenizer, self.answers, self.size = tokenizer, answers, group_size

    def generate(self, prompts, params, on_step=None):
        outputs = []
        for k in range(len(prompts)):
            ids = self.tokenizer.encode(self.answers[k // self.size], add_special_tokens=False)
            outputs.append(GenerationOutput(ids, [-0.5] * len(ids), [0] * len(ids), "stop"))
        return outputs

    def update_weights(self, named_tensors, version) -> None:
        pass


@pytest.mark.parametrize("kind", ["sleep", "raise"])
def test_the_sampler_refuses_only_the_group_whose_rule_failed(kind: str) -> None:
    tokenizer = load_tokenizer(resolve_model(TINY))
    fn = _rule(kind, "hang")
    name = _register(fn)
    config = load_config(
        None,
        [
            f"rewards=[{{name: '{name}'}}, {{name: numeric_match, normalize: group}}]",
            "generator.group_size=2",
            f"scoring.rule_timeout_s={BOUND_S}",
        ],
    )
    stream = prompt_stream(config)
    answers = [stream[0].ground_truth, "hang", "0"]
    ticks: list[int] = []
    sampler = Sampler(
        config,
        EchoEngine(tokenizer, answers, 2),
        tokenizer,
        0,
        None,
        on_rule_group=lambda: ticks.append(1),
    )
    try:
        groups = sampler.generate_groups([0, 1, 2], epoch=0)
    finally:
        sampler.close()
    first, refused, last = groups
    why = "took over 1 s" if kind == "sleep" else "raised ValueError: cannot read this one"
    assert why in refused.unscored and not first.unscored and not last.unscored
    assert all(t.reward != t.reward for t in refused.trajectories)  # NaN: no reward, never 0
    assert [t.reward_parts[0] for t in first.trajectories] == [1.0, 1.0]
    assert [t.reward for t in first.trajectories] == [1.0, 1.0]  # 1 + group-normalised 0s
    # Outcomes (the difficulty sampler's) are recorded for the scored groups only.
    assert [index for index, _ in sampler.outcomes] == [0, 2]
    figures = sampler.rules_worker.figures
    assert (figures.timeouts, figures.errors) == ((1, 0) if kind == "sleep" else (0, 1))
    assert len(ticks) == 3  # one step of progress per group, scored or refused


def test_a_group_whose_metadata_cannot_travel_is_refused_alone() -> None:
    worker = RuleWorker([RewardSpec(name="numeric_match")], {}, BOUND_S)
    try:
        odd = [RewardInput("7", [1], "7", metadata={"row": object()})]
        out = worker.score([_group("7"), odd, _group("8")])
        assert out[0] == [[1.0]] and out[2] == [[0.0]]
        assert isinstance(out[1], str) and "metadata cannot be sent" in out[1]
        assert worker.figures.errors == 1
    finally:
        worker.close()


def test_a_worker_whose_rules_do_not_resolve_fails_in_one_line() -> None:
    worker = RuleWorker([RewardSpec(name="no_such_module_52:reward")], {}, BOUND_S)
    with pytest.raises(RuntimeError, match="rule reward worker cannot score: .*no_such_module"):
        worker.score([_group("7")])
    assert worker.process is None  # ended, by its pid


def test_one_unnormalised_rule_is_its_weighted_score_as_ever() -> None:
    tokenizer = load_tokenizer(resolve_model(TINY))
    overrides = ["rewards=[{name: numeric_match, weight: 0.5}]", "generator.group_size=2"]
    config = load_config(None, overrides)
    answers = [prompt_stream(config)[0].ground_truth, "no number"]
    sampler = Sampler(config, EchoEngine(tokenizer, answers, 2), tokenizer, 0, None)
    try:
        right, wrong = sampler.generate_groups([0, 1], epoch=0)
    finally:
        sampler.close()
    assert [t.reward for t in right.trajectories + wrong.trajectories] == [0.5, 0.5, 0.0, 0.0]
    assert sampler.plain and right.trajectories[0].reward_parts == []
