"""A lagged copy of the student as its own teacher (``teacher: {model: self, refresh_every:
N}``, docs/design.md §7d): self-distillation, its lag a bound like staleness.

The role holds the student's model and follows the learners' weight stream as a generator
does (``GeneratorWeights``, a subscriber of its own), but it moves only to multiples of
``N``: each request names the newest behaviour version of its group (and its learner epoch),
and the teacher's target is the newest multiple of ``N`` at or below the newest it has seen.
Between targets the diffs wait as received (the image is the role's own, never the model's
parameters: ``own_image``), so the model scores with exactly the version it reports. Every
answer carries that version (``ScoreReply.teacher_version``); the generator refuses a group
more than ``teacher.lag_bound`` versions newer than it (counted) and the learner logs the
lag of what it trains on (``distill/teacher_lag``).

Example: refresh_every 5, requests of versions 3, 7, 12 -> the teacher holds 0, then 5 (once
the stream brought it), then 10; the answer to the version-12 group says 10 (lag 2).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import zmq

from streamrl.config import TeacherSpec
from streamrl.protocol import GeneratorActivity, LearnerClockInfo
from streamrl.rewards.scorer import ScoreItem, TokenAnswer
from streamrl.role_specs import GeneratorSpec
from streamrl.workers.engines.base import EngineArgs
from streamrl.workers.engines.hf import HFEngine, HFOptions
from streamrl.workers.generation.generator_weights import GeneratorWeights
from streamrl.workers.reward_roles.teacher import TeacherScorer

log = logging.getLogger(__name__)


class LaggedTeacher:
    """A ``TokenScorer`` (``streamrl.rewards.scorer``) whose weights are the student's of
    ``version``, moved by ``follow`` (a request's clock) and ``tend`` (the serve loop)."""

    per_token = True

    def __init__(
        self,
        student: GeneratorSpec,
        teacher: TeacherSpec,
        label: str,
        *,
        device: str,
        compute_dtype: torch.dtype,
    ) -> None:
        model_dir = Path(student.model_dir)
        dtype = str(compute_dtype).removeprefix("torch.")
        # The HF engine as a holder of weights (it never generates here): the subscriber's
        # versions reach its model through ``prepare_weights``, LoRA merged when the student
        # trains an adapter.
        self.engine = HFEngine(
            EngineArgs(model_dir, device=device, dtype=dtype),
            HFOptions(prepack=False, fast_decode=False),
        )
        self.ctx = zmq.Context()
        self.weights = GeneratorWeights(
            self.ctx,
            self.engine,
            student,
            GeneratorActivity(),
            lambda: None,
            background=False,
            own_image=True,
        )
        self.every = teacher.refresh_every
        self.scorer = TeacherScorer(
            model_dir,
            label,
            device=device,
            compute_dtype=compute_dtype,
            top_k=teacher.top_k,
            target_tau=teacher.target_tau,
            model=self.engine.model,
        )
        self.identity = self.scorer.identity
        self.clock = LearnerClockInfo(0, 0)  # the newest group version (and epoch) seen

    @property
    def version(self) -> int:
        """The student's version this teacher scores with."""
        return self.engine.version

    def follow(self, version: int, epoch: int) -> None:
        """A request's group was sampled at ``version`` of learner epoch ``epoch``."""
        if (epoch, version) > (self.clock.weights_epoch, self.clock.learner_version):
            self.clock = LearnerClockInfo(version, epoch)
            self.weights.follow_clock(self.clock)

    def tend(self) -> None:
        """Between batches: move to the target once the stream holds it, else receive."""
        target = self.clock.learner_version // self.every * self.every
        if target > self.engine.version or self.weights.held_epoch < self.weights.weights_epoch:
            before = self.engine.version
            self.weights.up_to = target
            self.weights.poll()
            if self.engine.version != before:
                log.info("lagged teacher: now the student of version %d", self.engine.version)
        else:
            self.weights.receive_only()

    def score(self, items: list[ScoreItem]) -> list[TokenAnswer]:
        return self.scorer.score(items)

    def shutdown(self) -> None:
        self.weights.close()
        self.ctx.destroy(linger=0)
