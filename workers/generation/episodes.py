"""Multi-turn episodes over an engine, token-in and token-out (docs/design.md §7).

Every active episode's context (its prompt's ids, then every token of every turn so far) goes
to ``engine.generate`` as one batch; each turn's sampled ids, behaviour logprobs and versions
are kept as the engine returned them, never re-tokenised. The turn's text goes to the
episode's environment (``streamrl.envs``); its observation is rendered as the next user turn
of the model's chat template (``TurnRenderer``) and appended as environment tokens: action
mask 0, logprob 0, and the version the engine holds when it is appended (so an episode's
oldest version is always one of its policy tokens'). Then the next turn, for the episodes
still going.

How an episode ends (``Episode.finish_reason``):

| ``stop``   | the environment's normal end (``done``)                                      |
| ``turns``  | ``env.max_turns`` policy turns taken and the environment not done             |
| ``length`` | ``env.max_tokens`` reached by a turn or an observation (``end_reason``)      |
| ``error``  | a malformed action the environment refused, or ``reset``/``step`` raised,     |
|            | hung past ``env.step_timeout_s`` or returned something else (``end_reason``)  |
| ``abort``  | the engine gave the turn up                                                   |

A turn cut at ``generator.max_new_tokens`` does not end its episode: the environment reads
what the turn has (counted as ``cut_turns``), and the observation follows the template's whole
turn closing, end-of-turn token included. None of these stops the generator: the episode is
kept with what it has and its reward.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from streamrl.config import Config, EnvConfig
from streamrl.envs import Environment, StepResult, environment_factory
from streamrl.models import encode_prompt, stop_token_ids
from streamrl.protocol import Trajectory, pack_float32, pack_int32
from streamrl.tasks.base import Prompt
from streamrl.workers.engines.base import Engine, GenerationOutput, SamplingParams, StepHook

log = logging.getLogger(__name__)

_ANSWER, _OBSERVATION = "\x00ANSWER\x00", "\x00OBSERVATION\x00"


class TurnRenderer:
    """The tokens that follow a policy turn ended by its end-of-turn token, up to the next
    assistant turn's start, with an observation as the user turn between: read off the
    model's own chat template, so any chat model renders turns as it was trained to."""

    def __init__(self, tokenizer, stop_token_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        turn = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": _ANSWER}]
        before = tokenizer.apply_chat_template(turn, tokenize=False)
        after = tokenizer.apply_chat_template(
            [*turn, {"role": "user", "content": _OBSERVATION}],
            tokenize=False,
            add_generation_prompt=True,
        )
        if not after.startswith(before) or _ANSWER not in before:
            raise ValueError("the chat template renders a conversation's turns inconsistently")
        closing = before[before.index(_ANSWER) + len(_ANSWER) :]
        # After a turn cut at max_new_tokens, the whole of the template's turn closing; after
        # a turn the policy ended with its end-of-turn token, what the closing has beyond that
        # token's text (SmolLM2: the newline after it).
        self.after_cut = closing + after[len(before) :]
        self.after_stop = self.after_cut
        for token in tokenizer.convert_ids_to_tokens(list(stop_token_ids)):
            if token and closing.startswith(token):
                self.after_stop = closing[len(token) :] + after[len(before) :]
                break

    def observation_ids(self, observation: str, *, stopped: bool = True) -> list[int]:
        """The tokens to append after a policy turn (``stopped``: ended by its end-of-turn
        token, else cut) for the environment's ``observation``."""
        template = self.after_stop if stopped else self.after_cut
        text = template.replace(_OBSERVATION, observation)
        return list(self.tokenizer.encode(text, add_special_tokens=False))


@dataclass
class Episode:
    prompt: Prompt
    prompt_ids: list[int]
    env: Environment
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    finish_reason: str = ""  # "" while it goes on (module table)
    end_reason: str = ""
    success: bool = False
    counts: dict[str, float] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    def end(self, finish_reason: str, reason: str = "") -> None:
        self.finish_reason, self.end_reason = finish_reason, reason

    def append(
        self, ids: list[int], logprobs: list[float], versions: list[int], *, policy: bool
    ) -> None:
        self.response_ids += ids
        self.logprobs += logprobs
        self.versions += versions
        self.action_mask += [int(policy)] * len(ids)


class EnvCalls:
    """An environment's ``reset``/``step`` on a worker thread, with a deadline: a call that
    raises, hangs or returns something else becomes a one-line reason, never an exception.
    A hung call's thread is left behind (Python cannot kill a thread) and a fresh pool
    serves the next calls."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.pool = self._new_pool()

    @staticmethod
    def _new_pool() -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="env")

    def call(self, what: str, fn: Callable, *args) -> object:
        future = self.pool.submit(fn, *args)
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = self._new_pool()
            return _Failed(f"environment {what} timed out after {self.timeout_s:g} s")
        except Exception as exc:  # a user's environment: its failure ends one episode
            text = " ".join(str(exc).split())[:200]
            return _Failed(f"environment {what} raised {type(exc).__name__}: {text}")

    def step(self, env: Environment, text: str) -> StepResult | str:
        result = self.call("step", env.step, text)
        if isinstance(result, _Failed):
            return result.reason
        if not isinstance(result, StepResult):
            return f"environment step returned {type(result).__name__}, not a StepResult"
        return _malformed(result) or result

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Failed:
    reason: str


def _malformed(result: StepResult) -> str | None:
    """Why a ``StepResult`` cannot be used (a user's environment filled it), or None."""
    number = (int, float)
    if not isinstance(result.observation, str):
        return f"environment step's observation is {type(result.observation).__name__}, not str"
    if not isinstance(result.reward, number) or not math.isfinite(result.reward):
        return f"environment step's reward is {result.reward!r}, not a finite number"
    if not isinstance(result.counts, dict) or not all(
        isinstance(k, str) and isinstance(v, number) for k, v in result.counts.items()
    ):
        return "environment step's counts are not a dict of names to numbers"
    return None


def start_episodes(
    prompts: list[Prompt],
    copies: int,
    make_env: Callable[[], Environment],
    tokenizer,
    max_prompt_tokens: int,
    calls: EnvCalls,
) -> list[Episode]:
    """``copies`` episodes of each prompt (a GRPO group each), in prompt order, each with a
    fresh environment reset on its prompt. An environment's ``instructions`` replace the
    prompt's system message, and its ``examples`` come before the question."""
    episodes = []
    for prompt in prompts:
        for _ in range(copies):
            env = make_env()
            shown = _with_preamble(prompt, env.instructions, env.examples)
            episode = Episode(prompt, encode_prompt(tokenizer, shown, max_prompt_tokens), env)
            failed = calls.call("reset", env.reset, prompt)
            if isinstance(failed, _Failed):
                episode.end("error", failed.reason)
            episodes.append(episode)
    return episodes


def _with_preamble(prompt: Prompt, instructions: str, examples: tuple[dict, ...]) -> Prompt:
    """``prompt`` with the environment's system prompt (if any) in place of its own, and its
    example messages before the question."""
    if not instructions and not examples:
        return prompt
    system = [m for m in prompt.messages if m["role"] == "system"]
    if instructions:
        system = [{"role": "system", "content": instructions}]
    turns = [m for m in prompt.messages if m["role"] != "system"]
    return replace(prompt, messages=[*system, *map(dict, examples), *turns])


def play(
    engine: Engine,
    episodes: list[Episode],
    params: SamplingParams,
    config: EnvConfig,
    renderer: TurnRenderer,
    calls: EnvCalls,
    on_step: StepHook | None = None,
) -> None:
    """Run ``episodes`` to their ends, a turn of every active one per ``generate`` call."""
    while True:
        active = [e for e in episodes if not e.done]
        if not active:
            return
        room = max(config.max_tokens - len(e.response_ids) for e in active)
        turn = replace(params, max_new_tokens=min(params.max_new_tokens, room))
        outputs = engine.generate([e.prompt_ids + e.response_ids for e in active], turn, on_step)
        for episode, out in zip(active, outputs, strict=True):
            _take_turn(episode, out, engine, config, renderer, calls)


def _take_turn(
    episode: Episode,
    out: GenerationOutput,
    engine: Engine,
    config: EnvConfig,
    renderer: TurnRenderer,
    calls: EnvCalls,
) -> None:
    room = config.max_tokens - len(episode.response_ids)
    kept = out.response_ids[:room]
    episode.append(kept, out.logprobs[:room], out.token_versions[:room], policy=True)
    episode.turns += 1
    stopped = out.finish_reason == "stop" and len(out.response_ids) <= room
    if not stopped and len(episode.response_ids) >= config.max_tokens:
        return episode.end("length", f"env.max_tokens={config.max_tokens} reached in a turn")
    if out.finish_reason == "abort":
        return episode.end("abort")
    if not stopped:  # cut at max_new_tokens: the environment reads what there is
        episode.counts["cut_turns"] = episode.counts.get("cut_turns", 0.0) + 1
    text = renderer.tokenizer.decode(kept, skip_special_tokens=True)
    result = calls.step(episode.env, text)
    if isinstance(result, str):
        return episode.end("error", result)
    episode.reward += float(result.reward)
    for name, count in result.counts.items():
        episode.counts[name] = episode.counts.get(name, 0.0) + float(count)
    if result.error:
        return episode.end("error", " ".join(result.error.split())[:200])
    if result.done:
        episode.success = bool(result.success)
        return episode.end("stop")
    if episode.turns >= config.max_turns:
        return episode.end("turns")
    observation = renderer.observation_ids(result.observation, stopped=stopped)
    if len(episode.response_ids) + len(observation) >= config.max_tokens:
        too_long = f"an observation of {len(observation)} tokens passes env.max_tokens"
        return episode.end("length", f"{too_long}={config.max_tokens}")
    n = len(observation)
    episode.append(observation, [0.0] * n, [engine.version] * n, policy=False)


class EpisodeRunner:
    """A generator's episodes: the job's environment, its rendering and calls, and the counts
    of how episodes ended (``GeneratorReport.episode_ends``/``episode_errors``)."""

    def __init__(self, config: Config, tokenizer) -> None:
        self.config, self.tokenizer = config, tokenizer
        self.make_env = environment_factory(config.env)
        self.renderer = TurnRenderer(tokenizer, stop_token_ids(tokenizer))
        self.calls = EnvCalls(config.env.step_timeout_s)
        self.ends: dict[str, int] = {}
        self.errors: dict[str, int] = {}

    def play(
        self,
        engine: Engine,
        prompts: list[Prompt],
        copies: int,
        params: SamplingParams,
        on_step: StepHook | None = None,
        *,
        count: bool = True,
    ) -> list[Episode]:
        """``copies`` episodes of each prompt, played to their ends (in prompt order);
        ``count``: add how they ended to the run's counts (evaluations do not)."""
        episodes = start_episodes(
            prompts,
            copies,
            self.make_env,
            self.tokenizer,
            self.config.data.max_prompt_tokens,
            self.calls,
        )
        play(engine, episodes, params, self.config.env, self.renderer, self.calls, on_step)
        if count:
            for e in episodes:
                self.ends[e.finish_reason] = self.ends.get(e.finish_reason, 0) + 1
                if e.finish_reason == "error":
                    kind = e.end_reason.split(":", 1)[0]  # "malformed tool call", ...
                    self.errors[kind] = self.errors.get(kind, 0) + 1
        return episodes

    def text(self, episode: Episode) -> str:
        """The whole episode after its prompt, as the model saw it (special tokens kept)."""
        return self.tokenizer.decode(episode.response_ids)

    def trajectory(self, episode: Episode, generator_id: int, temperature: float) -> Trajectory:
        return Trajectory(
            prompt_ids=pack_int32(episode.prompt_ids),
            response_ids=pack_int32(episode.response_ids),
            behavior_logprobs=pack_float32(episode.logprobs),
            token_versions=pack_int32(episode.versions),
            reward=episode.reward,
            finish_reason=episode.finish_reason,
            generator_id=generator_id,
            response_text=self.text(episode),
            temperature=temperature,
            action_mask=bytes(episode.action_mask),
            turns=episode.turns,
            end_reason=episode.end_reason,
        )

    def close(self) -> None:
        self.calls.close()
