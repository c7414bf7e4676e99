"""Off-policy guidance (``algorithm.guidance``): a prompt's reference response in place of one
sample of a group that found nothing as good.

A group whose samples all score below its prompt's reference response (``Prompt.reference``: a
built-in task's worked answer, a table's ``data.reference_key``) has nothing to move toward:
eight wrong answers alike are a flat group, dropped, and the question stays wrong for the rest
of the run (the default job's negative differences: 14% right). With the reference in place
of one sample the group teaches: the reference takes the group's top advantage, the samples
below it a negative one (LUFFY, Yan et al. 2025, mixes such off-policy traces into on-policy
groups). A group with a sample as good as the reference is left as it was sampled.

The reference rides with its group from sampling on, one trajectory past ``group_size``, so
every reward scores it as it scores a sample (rules here, served rewards at their roles); once
the group is settled, ``settle`` keeps it in place of the group's last sample (the samples are
exchangeable) or takes it out. It was never sampled: ``Trajectory.guided`` marks it, its
behaviour logprobs are zeros that the learner replaces with its proximal logprobs (correction
weight 1), its tokens count as no generation, and the sample it displaced is counted lost
(``generation/lost/guidance``). Its token versions are the group's newest, so its staleness
is the samples'. A teacher's scores of it are dropped (its term needs behaviour logprobs): it
trains by its reward's advantage alone.

Example: rewards [0.5] x 8 and a reference scoring 2.0 -> the group trains on 7 samples at 0.5
and the reference at 2.0 (GRPO advantages -0.38 and +2.65); a group with a sample at 2.0 keeps
its 8 samples.
"""

from __future__ import annotations

import logging
import math

from streamrl.config import Config
from streamrl.data import Prompt
from streamrl.models import stop_token_ids
from streamrl.models.prompt import has_chat_template
from streamrl.protocol import Trajectory, TrajectoryGroup, pack_int32

log = logging.getLogger(__name__)


class Guidance:
    """References to add to groups, and the choice, once scored, of keeping each."""

    def __init__(self, tokenizer, max_new_tokens: int, generator_id: int) -> None:
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.generator_id = generator_id
        self.stops = set(stop_token_ids(tokenizer))
        self.groups_guided = 0  # groups trained with their reference
        self.too_long = 0  # references longer than max_new_tokens, not used (logged once)
        self.tokens_displaced = 0  # generated tokens of the samples the references displaced

    def response_ids(self, prompt: Prompt) -> list[int] | None:
        """The reference as the model would answer it: its tokens through the end-of-turn
        token the chat template writes after an assistant turn (without a template: the
        text, then the line end that stops a plain prompt's answer). None without a reference,
        or when it is longer than ``generator.max_new_tokens`` (no sample could be it)."""
        if not prompt.reference:
            return None
        ids = self._tail(prompt) if has_chat_template(self.tokenizer) else None
        if ids is None:
            ids = self.tokenizer.encode(prompt.reference + "\n", add_special_tokens=False)
        end = next((i for i, token in enumerate(ids) if token in self.stops), None)
        ids = ids[: end + 1] if end is not None else [*ids, self.tokenizer.eos_token_id]
        if len(ids) <= self.max_new_tokens:
            return ids
        if not self.too_long:
            log.warning(
                "guidance: the reference of prompt %s has %d tokens, more than "
                "generator.max_new_tokens (%d): not used (nor any longer one; not logged again)",
                prompt.prompt_id,
                len(ids),
                self.max_new_tokens,
            )
        self.too_long += 1
        return None

    def _tail(self, prompt: Prompt) -> list[int] | None:
        """The chat template's rendering of the reference as the assistant's turn, less the
        generation prompt before it; None where the template does not render it that way."""
        template = self.tokenizer.apply_chat_template
        asked = template(prompt.messages, add_generation_prompt=True, tokenize=False)
        answered = template(
            [*prompt.messages, {"role": "assistant", "content": prompt.reference}],
            tokenize=False,
        )
        if not answered.startswith(asked):
            return None
        return self.tokenizer.encode(answered[len(asked) :], add_special_tokens=False)

    def reference(self, prompt: Prompt, prompt_ids: bytes, temperature: float) -> Trajectory | None:
        """``prompt``'s reference as one more trajectory of its group (unscored; its token
        versions are the group's newest once ``settle`` keeps it), or None where it has none
        (``response_ids``)."""
        ids = self.response_ids(prompt)
        if ids is None:
            return None
        return self.trajectory(prompt_ids, ids, temperature, version=0)

    def trajectory(
        self, prompt_ids: bytes, response_ids: list[int], temperature: float, version: int
    ) -> Trajectory:
        """The reference as a trajectory of a group sampled up to ``version`` (unscored)."""
        n = len(response_ids)
        return Trajectory(
            prompt_ids=prompt_ids,
            response_ids=pack_int32(response_ids),
            behavior_logprobs=bytes(4 * n),
            token_versions=pack_int32([version] * n),
            reward=float("nan"),
            finish_reason="stop",
            generator_id=self.generator_id,
            response_text=self.tokenizer.decode(response_ids, skip_special_tokens=True),
            temperature=temperature,
            guided=True,
        )

    def settle(self, group: TrajectoryGroup) -> None:
        """A settled group's reference in place of its last sample where no sample scores as
        well as it (and every reward is a number), else out of the group."""
        if not group.trajectories or not group.trajectories[-1].guided:
            return
        reference = group.trajectories.pop()
        sampled = group.trajectories
        rewards = [t.reward for t in sampled]
        if group.unscored or not all(map(math.isfinite, [*rewards, reference.reward])):
            return
        if max(rewards) >= reference.reward:
            return
        self.tokens_displaced += sampled[-1].num_policy_tokens
        self.groups_guided += 1
        # As stale as the samples it joins: their newest version (the displaced one's too).
        newest = max(t.max_version for t in sampled)
        reference.token_versions = pack_int32([newest] * reference.num_response_tokens)
        # A teacher's term compares its logprobs with the behaviour's, which a reference
        # does not have: it trains by its reward's advantage alone.
        reference.teacher_logprobs, reference.teacher_coef = b"", 0.0
        reference.teacher_top_ids, reference.teacher_top_logprobs = b"", b""
        reference.teacher_top_coef = 0.0
        sampled[-1] = reference


class NoGuidance:
    """``algorithm.guidance`` off: no group carries a reference, none is guided."""

    groups_guided = 0
    tokens_displaced = 0

    def reference(self, prompt: Prompt, prompt_ids: bytes, temperature: float) -> None:
        return None

    def settle(self, group: TrajectoryGroup) -> None:
        return None


def guidance_for(config: Config, tokenizer, generator_id: int) -> Guidance | NoGuidance:
    """The generator's guidance part for ``config`` (``algorithm.guidance``)."""
    if not config.algorithm.guidance:
        return NoGuidance()
    return Guidance(tokenizer, config.generator.max_new_tokens, generator_id)
