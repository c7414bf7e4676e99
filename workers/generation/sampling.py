"""The generator's sampling: granted prompts in, scored trajectory groups out.

One group per prompt of ``generator.group_size`` samples: a response each, scored by the job's
rewards (``streamrl.rewards``, which see the question: ``RewardInput.of``; the rules in a
child process under a time bound, ``workers.generation.rule_worker``), or with an environment
(``env.name``) an episode each (``workers.generation.episodes``), scored by it. A group whose rule
raised or outran ``scoring.rule_timeout_s`` comes back refused (``TrajectoryGroup.unscored``,
its rewards NaN): pushed as it is, the shard drops and counts it (docs/design.md §7c). The
sampling parameters are the generator's, with the live ``temperature`` (docs/design.md §8);
``tokens_generated`` counts every sampled token (policy tokens only, for episodes). With
``generator.probe_candidates`` each group's prompt is chosen among its grant's candidates by a
probe response each (``workers.generation.probing``).

Example: prompts [p, q], group size 2 -> the engine gets [p, p, q, q] in one call and two
groups come back, each tagged with the learner epoch the call started on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable

from streamrl.algorithms.group_filter import has_reward_variance
from streamrl.callables import blobs_for
from streamrl.config import Config
from streamrl.data import Prompt, prompt_stream
from streamrl.models import encode_prompt, stop_token_ids
from streamrl.protocol import OUTCOME_WINDOW, Trajectory, TrajectoryGroup, pack_int32
from streamrl.rewards import RewardInput
from streamrl.rewards.mix import RewardMix
from streamrl.workers.engines import Engine, GenerationOutput, SamplingParams
from streamrl.workers.engines.base import StepHook
from streamrl.workers.generation.episodes import EpisodeRunner
from streamrl.workers.generation.guidance import guidance_for
from streamrl.workers.generation.probing import sample_probed
from streamrl.workers.generation.rule_worker import RuleWorker
from streamrl.workers.generation.screening import Screening

log = logging.getLogger(__name__)


class Sampler:
    """The prompt stream, sampling parameters, rewards and episodes of one generator, over
    its engine. ``on_step`` runs between decode steps (in-flight weight updates) or is None;
    ``on_rule_group`` after each group the rules scored or refused (a step of progress)."""

    def __init__(
        self,
        config: Config,
        engine: Engine,
        tokenizer,
        generator_id: int,
        on_step: StepHook | None,
        on_rule_group: Callable[[], None] | None = None,
    ) -> None:
        gen = config.generator
        self.config, self.engine, self.tokenizer = config, engine, tokenizer
        self.generator_id, self.on_step = generator_id, on_step
        self.prompts = prompt_stream(config)
        # The rules, in a child process it can abandon (no process when there is no rule);
        # the Python API's callables go with it (``streamrl.callables``).
        self.rules_worker = RuleWorker(
            config.rewards, blobs_for(config), config.scoring.rule_timeout_s, on_rule_group
        )
        # Every reward's weight and normalisation (streamrl.rewards.mix); rules are scored
        # here, served rewards by their roles (workers.generation.scoring), then ``settle`` sums
        # them.
        # A teacher's weight is its distillation coefficient (``streamrl.rewards.distill``):
        # in the reward it weighs nothing.
        self.mix = RewardMix(
            [0.0 if r.kind == "teacher" else r.weight for r in config.rewards],
            [r.normalize for r in config.rewards],
        )
        self.served = [i for i, r in enumerate(config.rewards) if r.served]
        self.rules = [i for i, r in enumerate(config.rewards) if not r.served]
        # One rule, unnormalised: the reward is its weighted score, as it always was.
        self.plain = self.mix.plain and not self.served
        self.episodes = EpisodeRunner(config, tokenizer) if config.env.name else None
        # Off-policy guidance: each group's reference rides with it until it is settled.
        self.guidance = guidance_for(config, tokenizer, generator_id)
        # Screening: each group's first samples decide whether it gets the rest.
        self.screening = Screening(gen.screen_samples or gen.group_size, gen.group_size)
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
        # Probe sampling: the tokens of probes whose prompts were passed over (``probing``).
        self.probe_tokens_passed_over = 0

    def set_temperature(self, temperature: float) -> None:
        """The live knob: the next call samples at ``temperature``."""
        if temperature != self.params.temperature:
            self.params = dataclasses.replace(self.params, temperature=temperature)
            log.info("generator[%d]: temperature -> %s", self.generator_id, temperature)

    def generate_groups(
        self, prompt_indices: list[int], epoch: int, candidates: list[int] | None = None
    ) -> list[TrajectoryGroup]:
        """The groups of the granted prompts (indices into the prompt stream), tagged with
        ``epoch``: the learner epoch the call starts on. Tokens sampled after an in-flight
        switch to a restarted group's weights count as the old epoch's (the shard may drop
        the group: a regeneration, never a group trained on weights no learner has).
        ``candidates`` (probe sampling, ``Grant.candidates``): K - 1 more prompt indices per
        granted one; each group's prompt is then chosen among its grant's (``probing``)."""
        created = time.time()
        # Per group: why its rules refused it ("": scored; an episode is scored by its env).
        if candidates:  # each group's prompt chosen by its probe among the grant's
            prompt_indices, prompts, trajectories, refused = self._probed_trajectories(
                prompt_indices, candidates
            )
        else:
            prompts = [self.prompts[i] for i in prompt_indices]
            if self.episodes is not None:
                trajectories, refused = self._episode_groups(prompts), [""] * len(prompts)
            else:
                trajectories, refused = self._response_trajectories(prompts)
        finished = time.time()
        groups = [
            TrajectoryGroup(
                group_id="",  # given with its delivery identity when pushed (``ShardPushers``)
                prompt_id=prompt.prompt_id,
                trajectories=trajectories[i],
                created_at=created,
                finished_at=finished,
                data_source=prompt.data_source,
                ground_truth=prompt.ground_truth,
                weights_epoch=epoch,
                prompt_index=index,
                unscored=refused[i],
            )
            for i, (prompt, index) in enumerate(zip(prompts, prompt_indices, strict=True))
        ]
        for group in groups:
            if group.unscored:
                log.warning(
                    "generator[%d]: group of prompt %d refused: %s",
                    self.generator_id,
                    group.prompt_index,
                    group.unscored,
                )
        if self.episodes is not None or not self.served:
            for group in groups:  # every score is in: settled now
                self.settle(group, {})
        return groups

    def question(self, group: TrajectoryGroup) -> str:
        """The question a group answers (what its served scorers are shown)."""
        return self.prompts[group.prompt_index].question

    def settle(
        self, group: TrajectoryGroup, served: dict[int, tuple[list[float | None], str]]
    ) -> None:
        """Give each response its reward: the rules' scores (in ``reward_parts`` since it
        was sampled) and the served rewards' (``served``: per reward index, the scores and
        the scorer's identity) normalised, weighted and summed (``streamrl.rewards.mix``);
        then record the group's outcome for the difficulty sampler. An episode's reward is
        its environment's, as it came. A refused group (``unscored``) is left as it is: it
        has no reward and no outcome. With guidance, the group's reference then replaces a
        sample or leaves (``guidance``)."""
        if group.unscored:
            self.guidance.settle(group)
            return
        trajectories = group.trajectories
        if self.episodes is None and not self.plain:
            parts = self._reward_parts(trajectories)
            for i in self.served:
                if i not in served:  # a teacher routed to other data sources
                    parts[i] = [None] * len(trajectories)
                    continue
                scores, identity = served[i]
                parts[i] = scores
                group.scorers.append(identity)
            rewards, _ = self.mix.combine(parts)
            for j, t in enumerate(trajectories):
                t.reward = rewards[j]
                t.reward_parts = [
                    float("nan") if parts[i][j] is None else float(parts[i][j])  # type: ignore[arg-type]
                    for i in range(len(parts))
                ]
        sampled = [t.reward for t in trajectories if not t.guided]
        self.outcomes.append((group.prompt_index, not has_reward_variance(sampled)))
        self.outcomes_total += 1
        self.guidance.settle(group)

    def _response_trajectories(
        self, prompts: list[Prompt]
    ) -> tuple[list[list[Trajectory]], list[str]]:
        """Each prompt's ``group_size`` sampled responses (and its reference, with guidance),
        scored by the job's rules (one round trip to the rule worker for the whole call), and
        per prompt why its group is refused ("" when scored): its responses then carry NaN
        rewards."""
        screening = self.screening
        prompt_ids = [self._encode(p) for p in prompts]
        batch = [ids for ids in prompt_ids for _ in range(screening.first)]
        outputs = self.engine.generate(batch, self.params, self.on_step)
        trajectories, refused = self._scored(prompts, prompt_ids, outputs, screening.first)
        if not screening.active:
            return trajectories, refused
        rest = [
            i
            for i, group in enumerate(trajectories)
            if not refused[i] and not self._settled_early(group)
        ]
        if not rest:
            return trajectories, refused
        more = screening.size - screening.first
        batch = [prompt_ids[i] for i in rest for _ in range(more)]
        outputs = self.engine.generate(batch, self.params, self.on_step)
        extra, extra_refused = self._scored(
            [prompts[i] for i in rest], [prompt_ids[i] for i in rest], outputs, more, False
        )
        for k, i in enumerate(rest):
            group = trajectories[i]
            reference = group.pop() if group and group[-1].guided else None
            group.extend(extra[k])
            if reference is not None:  # last again (``guidance.settle`` looks for it there)
                group.append(reference)
            refused[i] = extra_refused[k]
        return trajectories, refused

    def _reward_parts(self, trajectories: list[Trajectory]) -> list[list[float | None]]:
        """Per reward (config order), each trajectory's score of it so far (``reward_parts``;
        NaN where a served reward has not answered)."""
        return [[t.reward_parts[i] for t in trajectories] for i in range(len(self.config.rewards))]

    def _settled_early(self, group: list[Trajectory]) -> bool:
        """Whether a group's first samples settle it (``screening``): their rewards by the
        rules (a screened job has no served reward), beside its reference's, if any."""
        if self.plain:
            rewards = [t.reward for t in group]
        else:
            rewards, _ = self.mix.combine(self._reward_parts(group))
        guided = bool(group) and group[-1].guided
        sampled = rewards[:-1] if guided else rewards
        return self.screening.settles(sampled, rewards[-1] if guided else None)

    def _probed_trajectories(
        self, granted: list[int], candidates: list[int]
    ) -> tuple[list[int], list[Prompt], list[list[Trajectory]], list[str]]:
        """Probe sampling (``workers.generation.probing``): the grant's prompts and their
        ``candidates`` probed once each, the least likely ``len(granted)`` sampled in full.
        Returns the chosen prompts' indices and prompts, in grant order, with their groups'
        trajectories and refusals."""
        indices = granted + candidates
        prompts = [self.prompts[i] for i in indices]
        prompt_ids = [self._encode(p) for p in prompts]
        size = self.config.generator.group_size
        probed = sample_probed(
            self.engine, prompt_ids, len(granted), size, self.params, self.on_step
        )
        self.probe_tokens_passed_over += probed.passed_over_tokens
        self.tokens_generated += probed.passed_over_tokens
        chosen = probed.chosen
        chosen_prompts = [prompts[c] for c in chosen]
        trajectories, refused = self._scored(
            chosen_prompts, [prompt_ids[c] for c in chosen], probed.outputs, size
        )
        return [indices[c] for c in chosen], chosen_prompts, trajectories, refused

    def _encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.config.data.max_prompt_tokens)

    def _scored(
        self,
        prompts: list[Prompt],
        prompt_ids: list[list[int]],
        outputs: list[GenerationOutput],
        size: int,
        with_references: bool = True,
    ) -> tuple[list[list[Trajectory]], list[str]]:
        """Each prompt's ``size`` outputs (in prompt order) as trajectories scored by the job's
        rules, then its reference's (guidance; not for the rest of a screened group, whose
        reference came with its first samples), and per prompt why its group is refused ("" when
        scored)."""
        temperature = self.params.temperature
        prompt_bytes = [pack_int32(ids) for ids in prompt_ids]
        sampled = [outputs[i * size : (i + 1) * size] for i in range(len(prompts))]
        texts = [
            [self.tokenizer.decode(out.response_ids, skip_special_tokens=True) for out in outs]
            for outs in sampled
        ]
        groups = [
            [
                RewardInput.of(prompt, text, out.response_ids, out.finish_reason)
                for text, out in zip(texts[i], sampled[i], strict=True)
            ]
            for i, prompt in enumerate(prompts)
        ]
        # Each group's reference (guidance), scored with its group as a sample is.
        references = [
            self.guidance.reference(prompt, prompt_bytes[i], temperature)
            if with_references
            else None
            for i, prompt in enumerate(prompts)
        ]
        for group, prompt, ref in zip(groups, prompts, references, strict=True):
            if ref is not None:
                group.append(RewardInput.of(prompt, ref.response_text, ref.response_list(), "stop"))
        scored = self.rules_worker.score(groups)
        refused = [result if isinstance(result, str) else "" for result in scored]
        weights = [self.config.rewards[i].weight for i in self.rules]
        trajectories: list[list[Trajectory]] = []
        for i, result in enumerate(scored):
            group = [
                Trajectory(
                    prompt_ids=prompt_bytes[i],
                    response_ids=pack_int32(out.response_ids),
                    behavior_logprobs=out.logprob_bytes(),
                    token_versions=pack_int32(out.token_versions),
                    reward=float("nan"),
                    finish_reason=out.finish_reason,
                    generator_id=self.generator_id,
                    response_text=text,
                    temperature=temperature,
                )
                for text, out in zip(texts[i], sampled[i], strict=True)
            ]
            if references[i] is not None:
                group.append(references[i])
            for j, t in enumerate(group):
                self._give_rule_scores(t, result, j, weights)
            trajectories.append(group)
        self.tokens_generated += sum(len(out.response_ids) for out in outputs)
        return trajectories, refused

    def _give_rule_scores(
        self, t: Trajectory, result: list[list[float]] | str, j: int, weights: list[float]
    ) -> None:
        """Response ``j``'s rule scores of its group's ``result`` onto ``t``: a refused group
        (``result`` a reason) has no reward at all, never a 0; one unnormalised rule is the
        reward (weighted), as ever; otherwise every reward's score in config order, the
        served ones NaN until settled."""
        parts = [float("nan")] * len(self.config.rewards)
        if isinstance(result, str):
            t.reward, t.reward_parts = float("nan"), parts
        elif self.plain:
            t.reward, t.reward_parts = weights[0] * result[j][0], []
        else:
            for i, score in zip(self.rules, result[j], strict=True):
                parts[i] = score
            t.reward, t.reward_parts = float("nan"), parts

    def _episode_groups(self, prompts: list[Prompt]) -> list[list[Trajectory]]:
        """``group_size`` episodes of each prompt with the environment, played to their ends:
        every turn's tokens with their mask, the environment's reward."""
        size = self.config.generator.group_size
        episodes = self.episodes.play(self.engine, prompts, size, self.params, self.on_step)
        self.tokens_generated += sum(sum(e.action_mask) for e in episodes)
        temperature = self.params.temperature
        flat = [self.episodes.trajectory(e, self.generator_id, temperature) for e in episodes]
        return [flat[i * size : (i + 1) * size] for i in range(len(prompts))]

    def close(self) -> None:
        self.rules_worker.close()
        if self.episodes is not None:
            self.episodes.close()
