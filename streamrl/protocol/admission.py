"""Between a generator and the controller's admission server: the request for a grant to
sample, the grant and its directives (knobs, the learner's clock, the receipts of groups the
buffer took)."""

from __future__ import annotations

from typing import NamedTuple

import msgspec


class AdmissionRequest(msgspec.Struct, tag="admission_request"):
    """A generator asks to start ``n_groups`` new prompt groups."""

    generator_id: int
    n_groups: int
    incarnation: int = 0  # a replaced generator's successor asks with a higher one
    sender: str = ""  # its group ids' sender name (``buffers.delivery``): the reply's receipts


class Grant(msgspec.Struct, omit_defaults=True):
    """Groups a generator may start now: ``granted`` of them, for the run's prompts
    ``prompt_indices`` in order (``data.PromptStream``), on weights of version
    ``>= min_version`` (the oldest that keeps them within the staleness bound when the learner
    consumes them; docs/design.md §3)."""

    granted: int = 0
    min_version: int = 0
    prompt_indices: list[int] = []
    # Probe sampling (``generator.probe_candidates`` K >= 2): K - 1 fresh prompt indices more
    # per granted group, among which the generator chooses its groups' prompts by a probe
    # each (``workers.generation.probing``); the ones not chosen are passed over.
    candidates: list[int] = []


class Directives(msgspec.Struct, omit_defaults=True):
    """What the controller tells a generator to do besides generating."""

    # Finish: drain to the learner's version (``LearnerClockInfo``) and exit.
    stop: bool = False
    # Leave the run (``generator.count`` lowered, or a replaced generator's predecessor): finish
    # now, without draining to the end.
    retire: bool = False
    # Evaluate the held-out prompts on weights of at least this version before the next call,
    # then send an ``EvalReport`` (-1: no evaluation asked; only generator 0 is asked: a
    # replaced generator keeps its id and scaling down retires the highest ids).
    eval_version: int = -1
    # Live generator knobs (PATCH /config, ``controller.knobs``): applied from the next call
    # on; None = unchanged.
    temperature: float | None = None
    prompts_per_call: int | None = None
    # The learner epoch of ``eval_version`` (``streamrl.clock``): weights of an older epoch
    # past its fork no longer exist, so an evaluation waits for this epoch's version.
    eval_epoch: int = 0


class LearnerClockInfo(msgspec.Struct, omit_defaults=True):
    """The learner clock as the controller last heard it (``streamrl.clock``)."""

    learner_version: int = 0
    # The learner group's incarnation: it rises when the group restarts from a checkpoint, whose
    # versions repeat numbers a generator may hold already, so it re-anchors every rank.
    weights_epoch: int = 0


class Receipts(msgspec.Struct, omit_defaults=True):
    """Acknowledged delivery (``buffers.delivery``): per shard id, the floor of the asking
    generator's groups that shard has (the generator forgets them), and how often the shard was
    restarted (a rise: send it every group it has not acknowledged again)."""

    delivered: dict[int, int] = {}
    shard_epochs: dict[int, int] = {}
    # Per reward role (its reward's index in ``rewards:``), how often it was restarted: a rise
    # means requests in flight to it were lost, and the generator sends them again.
    scorer_epochs: dict[int, int] = {}
    # Per reward role, the endpoint of its current incarnation: a role restarted on another
    # node (or port) is reached there; the generator reconnects when it changes.
    scorer_endpoints: dict[int, str] = {}


class ReplyParts(NamedTuple):
    """An ``AdmissionReply``'s four parts."""

    grant: Grant
    directives: Directives
    clock: LearnerClockInfo
    receipts: Receipts


class AdmissionReply(msgspec.Struct, tag="admission_reply", omit_defaults=True):
    """The controller's answer to an ``AdmissionRequest``, in four parts that a generator
    handles one method each: the ``grant``, the ``directives``, the learner ``clock`` and the
    delivery ``receipts``. Read them with ``parts()``.

    A reply never outlives the launch that sent it (controller and generators start together),
    so unlike ``TrajectoryGroup`` it keeps no older form: a part left out decodes to its default.

    Example::

        reply = AdmissionReply(grant=Grant(2, 5, [40, 41]), clock=LearnerClockInfo(6))
        grant, directives, clock, receipts = reply.parts()
        grant.granted, directives.stop, receipts.delivered   # (2, False, {})
    """

    grant: Grant = msgspec.field(default_factory=Grant)
    directives: Directives = msgspec.field(default_factory=Directives)
    clock: LearnerClockInfo = msgspec.field(default_factory=LearnerClockInfo)
    receipts: Receipts = msgspec.field(default_factory=Receipts)

    def parts(self) -> ReplyParts:
        return ReplyParts(self.grant, self.directives, self.clock, self.receipts)
