"""The generator's sampling: granted prompts in, scored trajectory groups out.

One group per prompt of ``generator.group_size`` samples: a response each, scored by the job's
rewards (``streamrl.rewards``, which see the question: ``RewardInput.of``), or with an
environment (``env.name``) an episode each (``workers.episodes``), scored by it. The sampling
parameters are the generator's, with the live ``temperature`` (docs/design.md §8);
``tokens_generated`` counts every sampled token (policy tokens only, for episodes).

Example: prompts [p, q], group size 2 -> the engine gets [p, p, q, q] in one call and two
groups come back, each tagged with the learner epoch the call started on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque

from streamrl.algorithms.group_filter import has_reward_variance
from streamrl.config import Config
from streamrl.data import Prompt, prompt_stream
from streamrl.models import encode_prompt, stop_token_ids
from streamrl.protocol import OUTCOME_WINDOW, Trajectory, TrajectoryGroup, pack_int32
from streamrl.rewards import CombinedReward, RewardInput
from streamrl.workers.engines import Engine, SamplingParams
from streamrl.workers.engines.base import StepHook
from streamrl.workers.episodes import EpisodeRunner

log = logging.getLogger(__name__)


class Sampler:
    """The prompt stream, sampling parameters, rewards and episodes of one generator, over
    its engine. ``on_step`` runs between decode steps (in-flight weight updates) or is None."""

    def __init__(
        self,
        config: Config,
        engine: Engine,
        tokenizer,
        generator_id: int,
        on_step: StepHook | None,
    ) -> None:
        gen = config.generator
        self.config, self.engine, self.tokenizer = config, engine, tokenizer
        self.generator_id, self.on_step = generator_id, on_step
        self.prompts = prompt_stream(config)
        self.reward = CombinedReward(config.rewards)
        self.episodes = EpisodeRunner(config, tokenizer) if config.env.name else None
        self.params = SamplingParams(
            temperature=gen.temperature,
            top_p=gen.top_p,
            top_k=gen.top_k,
            max_new_tokens=gen.max_new_tokens,
            stop_token_ids=stop_token_ids(tokenizer),
        )
        self.tokens_generated = 0
        # The newest groups scored, (prompt index, every sample scored alike), and their
        # total: reported for the difficulty sampler (controller.difficulty).
        self.outcomes: deque[tuple[int, bool]] = deque(maxlen=OUTCOME_WINDOW)
        self.outcomes_total = 0

    def set_temperature(self, temperature: float) -> None:
        """The live knob: the next call samples at ``temperature``."""
        if temperature != self.params.temperature:
            self.params = dataclasses.replace(self.params, temperature=temperature)
            log.info("generator[%d]: temperature -> %s", self.generator_id, temperature)

    def generate_groups(self, prompt_indices: list[int], epoch: int) -> list[TrajectoryGroup]:
        """The groups of the granted prompts (indices into the prompt stream), tagged with
        ``epoch``: the learner epoch the call starts on. Tokens sampled after an in-flight
        switch to a restarted group's weights count as the old epoch's (the shard may drop
        the group: a regeneration, never a group trained on weights no learner has)."""
        size = self.config.generator.group_size
        prompts = [self.prompts[i] for i in prompt_indices]
        created = time.time()
        if self.episodes is not None:
            trajectories = self._episode_trajectories(prompts)
        else:
            trajectories = self._response_trajectories(prompts)
        finished = time.time()
        for i, index in enumerate(prompt_indices):
            rewards = [t.reward for t in trajectories[i * size : (i + 1) * size]]
            self.outcomes.append((index, not has_reward_variance(rewards)))
        self.outcomes_total += len(prompt_indices)
        return [
            TrajectoryGroup(
                group_id="",  # given with its delivery identity when pushed (``ShardPushers``)
                prompt_id=prompt.prompt_id,
                trajectories=trajectories[i * size : (i + 1) * size],
                created_at=created,
                finished_at=finished,
                data_source=prompt.data_source,
                ground_truth=prompt.ground_truth,
                weights_epoch=epoch,
                prompt_index=index,
            )
            for i, (prompt, index) in enumerate(zip(prompts, prompt_indices, strict=True))
        ]

    def _response_trajectories(self, prompts: list[Prompt]) -> list[Trajectory]:
        """``group_size`` sampled responses of each prompt, scored by the job's rewards."""
        size = self.config.generator.group_size
        prompt_ids = [
            encode_prompt(self.tokenizer, p, self.config.data.max_prompt_tokens) for p in prompts
        ]
        batch = [ids for ids in prompt_ids for _ in range(size)]
        outputs = self.engine.generate(batch, self.params, self.on_step)
        prompt_bytes = [pack_int32(ids) for ids in prompt_ids]
        trajectories = []
        for row, out in enumerate(outputs):
            prompt = prompts[row // size]
            text = self.tokenizer.decode(out.response_ids, skip_special_tokens=True)
            reward = self.reward(RewardInput.of(prompt, text, out.response_ids, out.finish_reason))
            trajectories.append(
                Trajectory(
                    prompt_ids=prompt_bytes[row // size],
                    response_ids=pack_int32(out.response_ids),
                    behavior_logprobs=out.logprob_bytes(),
                    token_versions=pack_int32(out.token_versions),
                    reward=reward,
                    finish_reason=out.finish_reason,
                    generator_id=self.generator_id,
                    response_text=text,
                    temperature=self.params.temperature,
                )
            )
            self.tokens_generated += len(out.response_ids)
        return trajectories

    def _episode_trajectories(self, prompts: list[Prompt]) -> list[Trajectory]:
        """``group_size`` episodes of each prompt with the environment, played to their ends:
        every turn's tokens with their mask, the environment's reward."""
        size = self.config.generator.group_size
        episodes = self.episodes.play(self.engine, prompts, size, self.params, self.on_step)
        self.tokens_generated += sum(sum(e.action_mask) for e in episodes)
        temperature = self.params.temperature
        return [self.episodes.trajectory(e, self.generator_id, temperature) for e in episodes]

    def close(self) -> None:
        if self.episodes is not None:
            self.episodes.close()
