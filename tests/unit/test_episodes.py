"""Multi-turn episodes (``workers.generation.episodes``): what the learner gets is exactly what was
sampled and what the environment said, turn after turn, and every way an episode can end is
an ending, never an exception. The engine here is mostly a test double that answers from a
script (the real engines run episodes in tests/integration/test_train_step.py and the launch
test); the tokenizer is the tiny model's real one. The contract's last test plays episodes
on the HF engine over every architecture of ``streamrl.models.tiny`` (Gemma3's
sliding-window layers, Phi-3's fused qkv, Qwen3-MoE's experts), against the learner's
forward."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec
import pytest
import torch
from support import learner_logprobs

from streamrl.config import EnvConfig, load_config
from streamrl.envs.base import Environment, StepResult
from streamrl.models import TINY, load_causal_lm, load_tokenizer, resolve_model, stop_token_ids
from streamrl.models.tiny import ARCHITECTURES
from streamrl.protocol import Trajectory, TrajectoryGroup
from streamrl.tasks.base import Prompt
from streamrl.workers.engines.base import Engine, EngineArgs, GenerationOutput, SamplingParams
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.generation.episodes import (
    EnvCalls,
    EpisodeRunner,
    TurnRenderer,
    play,
    start_episodes,
)

TOKENIZER = load_tokenizer(resolve_model(TINY))
STOP = stop_token_ids(TOKENIZER)
PARAMS = SamplingParams(max_new_tokens=8, stop_token_ids=STOP)


class ScriptedEngine(Engine):
    """Answers each context with ``reply(context text)`` -> (text, "stop" | "length"); logprob
    -0.5 per token; its version moves by one after every call (weights updated in flight)."""

    def __init__(self, reply: Callable[[str], tuple[str, str]]) -> None:
        self.reply, self.version, self.contexts = reply, 3, []

    def generate(self, prompts, params, on_step=None):
        self.contexts.append([list(p) for p in prompts])
        outputs = []
        for prompt in prompts:
            text, finish = self.reply(TOKENIZER.decode(prompt))
            ids = TOKENIZER.encode(text, add_special_tokens=False)[: params.max_new_tokens]
            if finish == "stop" and len(ids) < params.max_new_tokens:
                ids.append(STOP[0])
            else:
                finish = "length"
            outputs.append(
                GenerationOutput(ids, [-0.5] * len(ids), [self.version] * len(ids), finish)
            )
        self.version += 1
        return outputs

    def update_weights(self, named_tensors, version) -> None:
        self.version = version


class Guess(Environment):
    def reset(self, prompt: Prompt) -> None:
        self.secret = int(prompt.ground_truth)

    def step(self, text: str) -> StepResult:
        guess = int(text.split()[0]) if text.split() and text.split()[0].isdigit() else -1
        if guess == self.secret:
            return StepResult(reward=1.0, done=True, success=True, counts={"guesses": 1})
        return StepResult(
            observation="up" if guess < self.secret else "down", counts={"guesses": 1}
        )


def _prompt(secret: int) -> Prompt:
    return Prompt(f"p{secret}", [{"role": "user", "content": "guess"}], str(secret), "test")


def _episodes(
    env: Callable[[], Environment],
    secrets: list[int],
    config: EnvConfig,
    engine: Engine,
    copies: int = 1,
):
    calls = EnvCalls(config.step_timeout_s)
    episodes = start_episodes([_prompt(s) for s in secrets], copies, env, TOKENIZER, 64, calls)
    play(engine, episodes, PARAMS, config, TurnRenderer(TOKENIZER, STOP), calls)
    calls.close()
    return episodes


def _counting_up(context: str) -> tuple[str, str]:
    """Guesses 1, then one more each turn (turns so far: the "up"s in the context)."""
    return str(1 + context.count("up")), "stop"


def test_an_episode_holds_every_turn_exactly_as_sampled_and_said() -> None:
    engine = ScriptedEngine(_counting_up)
    (episode,) = _episodes(Guess, [3], EnvConfig(max_turns=5), engine)
    assert (episode.finish_reason, episode.success, episode.reward, episode.turns) == (
        "stop",
        True,
        1.0,
        3,
    )
    renderer = TurnRenderer(TOKENIZER, STOP)
    turn = lambda text: [*TOKENIZER.encode(text, add_special_tokens=False), STOP[0]]  # noqa: E731
    expected = [
        *turn("1"),
        *renderer.observation_ids("up"),
        *turn("2"),
        *renderer.observation_ids("up"),
        *turn("3"),
    ]
    assert episode.response_ids == expected
    # Each turn was sampled from the prompt and every token before it, as the learner sees them.
    prompt = episode.prompt_ids
    assert [c[0] for c in engine.contexts] == [
        prompt,
        prompt + expected[: len(turn("1")) + len(renderer.observation_ids("up"))],
        prompt + expected[: -len(turn("3"))],
    ]
    n_obs, n_turn = len(renderer.observation_ids("up")), len(turn("1"))
    assert (
        episode.action_mask
        == [1] * n_turn + [0] * n_obs + [1] * n_turn + [0] * n_obs + [1] * n_turn
    )
    assert episode.logprobs == [-0.5 if m else 0.0 for m in episode.action_mask]
    # Versions: each turn's sampling version; the environment's tokens the version held when
    # they were appended (after the turn before them: never older than the episode's start).
    assert (
        episode.versions == [3] * n_turn + [4] * n_obs + [4] * n_turn + [5] * n_obs + [5] * n_turn
    )
    assert episode.counts == {"guesses": 3.0}


def test_the_trajectory_carries_the_mask_and_old_single_turn_frames_still_decode() -> None:
    config = load_config(
        None, [f"model.name={TINY}", "env.name=guess", "rewards=[]", "env.max_turns=5"]
    )
    runner = EpisodeRunner(config, TOKENIZER)
    runner.make_env = Guess
    (episode,) = runner.play(ScriptedEngine(_counting_up), [_prompt(2)], 1, PARAMS)
    runner.close()
    trajectory = runner.trajectory(episode, generator_id=0, temperature=1.0)
    assert trajectory.check() is None
    assert trajectory.action_mask_list() == episode.action_mask and trajectory.turns == 2
    assert trajectory.response_list() == episode.response_ids
    group = TrajectoryGroup("g", "p", [trajectory], 0.0, 0.0)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(group), type=TrajectoryGroup)
    assert decoded.trajectories[0] == trajectory
    assert runner.ends == {"stop": 1}

    class OldTrajectory(msgspec.Struct):  # the wire type before multi-turn episodes
        prompt_ids: bytes
        response_ids: bytes
        behavior_logprobs: bytes
        token_versions: bytes
        reward: float
        finish_reason: str
        generator_id: int
        response_text: str = ""
        temperature: float = 1.0

    old = OldTrajectory(
        b"\x01\x00\x00\x00",
        b"\x02\x00\x00\x00",
        b"\x00\x00\x00\x00",
        b"\x00\x00\x00\x00",
        1.0,
        "stop",
        0,
    )
    new = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=Trajectory)
    assert new.check() is None and new.action_mask_list() == [1] and new.turns == 0


def test_a_bad_action_mask_is_refused_by_check() -> None:
    t = Trajectory.from_lists([1], [2, 3], [-1.0, -1.0], [0, 0], 0.0, "stop", 0, action_mask=[1])
    assert t.check() == "2 response tokens, 1 action mask bytes"
    t = Trajectory.from_lists([1], [2, 3], [-1.0, -1.0], [0, 0], 0.0, "stop", 0, action_mask=[1, 2])
    assert t.check() == "action_mask holds a byte other than 0 and 1"


def test_limits_end_episodes_with_their_reason() -> None:
    never = ScriptedEngine(lambda context: ("0", "stop"))  # never right
    (turns,) = _episodes(Guess, [5], EnvConfig(max_turns=2), never)
    assert (turns.finish_reason, turns.turns, turns.success) == ("turns", 2, False)
    # A turn that reaches the episode's tokens is cut to them exactly: two turns of 8 (cut
    # at max_new_tokens) and the feedback between, and 3 tokens more.
    chatty = ScriptedEngine(lambda context: ("0 is my guess", "stop"))
    limit = 8 + len(TurnRenderer(TOKENIZER, STOP).observation_ids("up", stopped=False)) + 3
    (cut,) = _episodes(Guess, [5], EnvConfig(max_turns=9, max_tokens=limit), chatty)
    assert (cut.finish_reason, len(cut.response_ids), cut.turns) == ("length", limit, 2)
    assert cut.end_reason == f"env.max_tokens={limit} reached in a turn"
    assert cut.action_mask[-3:] == [1, 1, 1]
    # An observation that would pass them is not appended.
    (long,) = _episodes(Guess, [5], EnvConfig(max_turns=9, max_tokens=16), never)
    assert long.finish_reason == "length" and long.end_reason.startswith("an observation of")
    assert len(long.response_ids) < 16 and long.action_mask[-1] == 1


def test_a_turn_cut_at_max_new_tokens_goes_on_with_the_turn_closed() -> None:
    engine = ScriptedEngine(
        lambda context: ("1 2 3 4 5 6 7 8 9", "stop") if "up" not in context else ("3", "stop")
    )
    (episode,) = _episodes(Guess, [3], EnvConfig(max_turns=3), engine)
    assert (episode.finish_reason, episode.success, episode.counts["cut_turns"]) == (
        "stop",
        True,
        1.0,
    )
    renderer = TurnRenderer(TOKENIZER, STOP)
    first = TOKENIZER.encode("1 2 3 4 5 6 7 8 9", add_special_tokens=False)[:8]
    assert episode.response_ids[:8] == first
    closed = renderer.observation_ids("up", stopped=False)
    assert closed[0] == STOP[0] and episode.response_ids[8 : 8 + len(closed)] == closed


class Raises(Guess):
    def step(self, text: str) -> StepResult:
        raise RuntimeError("the tool's backend\nis down")


class Hangs(Guess):
    release = threading.Event()

    def step(self, text: str) -> StepResult:
        self.release.wait(30)
        return StepResult(done=True)


class ReturnsText(Guess):
    def step(self, text: str):
        return "done"


class BadReward(Guess):
    def step(self, text: str) -> StepResult:
        return StepResult(observation="up", reward=float("nan"))


class BadObservation(Guess):
    def step(self, text: str) -> StepResult:
        return StepResult(observation=["up"])


class ResetRaises(Guess):
    def reset(self, prompt: Prompt) -> None:
        raise ValueError("no such game")


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        (Raises, "environment step raised RuntimeError: the tool's backend is down"),
        (Hangs, "environment step timed out after 0.2 s"),
        (ReturnsText, "environment step returned str, not a StepResult"),
        (BadReward, "environment step's reward is nan, not a finite number"),
        (BadObservation, "environment step's observation is list, not str"),
        (ResetRaises, "environment reset raised ValueError: no such game"),
    ],
)
def test_an_environment_that_fails_ends_its_episode_only(env: type, reason: str) -> None:
    """Beside a healthy episode of the same call: it goes on to its end."""
    Hangs.release = threading.Event()  # released once this test has its verdict
    made = iter([env, Guess])
    engine = ScriptedEngine(_counting_up)
    started = time.monotonic()
    failed, healthy = _episodes(lambda: next(made)(), [2, 2], EnvConfig(step_timeout_s=0.2), engine)
    Hangs.release.set()
    assert (failed.finish_reason, failed.end_reason, failed.reward) == ("error", reason, 0.0)
    assert (healthy.finish_reason, healthy.success) == ("stop", True)
    assert time.monotonic() - started < 10
    if env is ResetRaises:
        assert failed.response_ids == [] and failed.turns == 0


@pytest.mark.parametrize("arch", [TINY, *ARCHITECTURES])
def test_episodes_on_every_architecture_are_what_the_learner_scores(arch: str) -> None:
    """The HF engine (fp32) plays three-turn episodes, two copies of two prompts: every
    turn is sampled from the prompt and every token before it, the environment's included
    (past Gemma3's window of 16 columns), each observation is the template's rendering, and
    the learner's one forward over the whole episode gives the behaviour logprob of every
    policy token."""
    model_dir = resolve_model(arch)
    tokenizer = load_tokenizer(model_dir)
    engine = HFEngine(EngineArgs(model_dir, dtype="float32", seed=0))
    contexts: list[list[int]] = []
    generate = engine.generate

    def recorded(prompts, params, on_step=None):
        contexts.extend(list(p) for p in prompts)
        return generate(prompts, params, on_step)

    engine.generate = recorded  # type: ignore[method-assign]
    config = EnvConfig(max_turns=3, max_tokens=200)
    params = SamplingParams(temperature=0.9, max_new_tokens=6, stop_token_ids=STOP)
    calls = EnvCalls(config.step_timeout_s)
    # Secrets the random model never guesses: every episode plays its three turns.
    episodes = start_episodes([_prompt(900), _prompt(901)], 2, Guess, tokenizer, 64, calls)
    play(engine, episodes, params, config, TurnRenderer(tokenizer, STOP), calls)
    calls.close()
    renderer = TurnRenderer(tokenizer, STOP)
    learner = load_causal_lm(model_dir, "float32").eval()
    for episode in episodes:
        assert (episode.finish_reason, episode.turns) == ("turns", 3), episode.end_reason
        ids, mask = episode.response_ids, episode.action_mask
        assert len(ids) == len(episode.logprobs) == len(episode.versions) == len(mask)
        whole = episode.prompt_ids + ids
        starts = [0] + [i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]]
        assert len(starts) == 3 and len(whole) > 16
        # Each turn's context is the episode up to that turn, exactly.
        assert all(whole[: len(episode.prompt_ids) + i] in contexts for i in starts)
        # Between turns: the environment's "up", as the chat template renders it.
        for start, end in zip(starts, starts[1:], strict=False):
            observation = [t for t, m in zip(ids[start:end], mask[start:end], strict=True) if not m]
            turn = ids[start:end][: len(ids[start:end]) - len(observation)]
            stopped = turn[-1] in STOP
            assert observation == renderer.observation_ids("up", stopped=stopped)
        assert all(lp == 0.0 for lp, m in zip(episode.logprobs, mask, strict=True) if not m)
        with torch.no_grad():
            reference = learner_logprobs(learner, episode.prompt_ids, ids, 0.9)
        policy = torch.tensor(mask, dtype=torch.bool)
        behaviour = torch.tensor(episode.logprobs)[policy]
        torch.testing.assert_close(behaviour, reference[policy], atol=1e-4, rtol=0)
