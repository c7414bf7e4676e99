"""What the roles tell the controller: the learner's steps and batches taken, a generator's
activity and weight stages, a shard's and a reward role's figures, evaluations with their
answers, heartbeats (``Report`` is the tagged union the controller reads)."""

from __future__ import annotations

import msgspec

from streamrl.protocol.shard import (
    ShardStats,
)


class LearnerStep(msgspec.Struct, tag="learner_step"):
    """Rank 0's summary of one optimizer step (the new version is ``version``).
    ``incarnation``: the learner group's restarts so far; the controller ignores reports of a
    group it replaced."""

    version: int
    metrics: dict[str, float]
    time: float
    incarnation: int = 0


class BatchTaken(msgspec.Struct, tag="batch_taken"):
    """One learner rank took its batch for step ``version`` (the version it will make): the
    stream indices of its groups' prompts (``TrajectoryGroup.prompt_index``). Sent before the
    step trains, so a resume from an older checkpoint can hand them out again."""

    rank: int
    version: int
    prompt_indices: list[int]
    incarnation: int = 0  # as ``LearnerStep.incarnation``


class GeneratorActivity(msgspec.Struct):
    """Cumulative seconds a generator spent by activity, timed inside its loop, and its calls
    (``streamrl bench``): generating and scoring; waiting for admission; waiting for a version
    it must hold; applying weights (between calls or in flight, while decoding pauses);
    evaluating."""

    busy_s: float = 0.0
    calls: int = 0  # generation calls (each decodes its granted groups' rows together)
    wait_admission_s: float = 0.0
    wait_weights_s: float = 0.0
    weights_pause_s: float = 0.0
    eval_s: float = 0.0


class WeightStages(msgspec.Struct):
    """Where the newest version a generator adopted spent its time from publish to adopted,
    stage by stage (wall seconds, docs/design.md §4), so that a slower weight path names its
    stage: ``arrive_s`` publish -> the version's last chunk taken off the socket by the weight
    thread (the learner's snapshot, encode and send, the wire, and that thread's write-ahead of
    the chunks before: the learner's ``weights/out_s`` splits it); ``queue_s`` received
    -> the weight thread starts on it; ``apply_s`` decoded, written into the image and
    verified; ``prepare_s`` the engine's copies made (``Engine.prepare_weights``); ``adopt_s``
    prepared -> adopted between decode steps. Their sum is ``GeneratorReport.weights_latency_s``
    (to the clocks' agreement where learner and generator are different hosts)."""

    version: int = -1
    arrive_s: float = 0.0
    queue_s: float = 0.0
    apply_s: float = 0.0
    prepare_s: float = 0.0
    adopt_s: float = 0.0


# The stages' names, in order, read off the struct (one list to keep).
WEIGHT_STAGES = tuple(f.removesuffix("_s") for f in WeightStages.__struct_fields__[1:])


OUTCOME_WINDOW = 512  # GeneratorReport.outcome_*: enough for the groups between two reports


class GeneratorReport(msgspec.Struct, tag="generator_report"):
    generator_id: int
    applied_version: int
    tokens_generated: int
    groups_pushed: int
    checksum_failures: int
    anchors_applied: int
    time: float
    # The most recent versions applied and checksum-verified (the last 100 at most).
    verified_versions: list[int] = []
    anchors_requested: int = 0
    weights_bytes_received: int = 0
    weights_apply_s: float = 0.0
    weights_latency_s: float = 0.0  # publish to applied, for the last version
    weights_stages: WeightStages = msgspec.field(default_factory=WeightStages)  # the same, split
    activity: GeneratorActivity = msgspec.field(default_factory=lambda: GeneratorActivity())
    incarnation: int = 0  # reports of a replaced generator's predecessor are ignored
    # Whole-image verifications of a learner shard (``ImageChecksum``): passed, and failed (each
    # failure repaired by an anchor of that rank).
    images_verified: int = 0
    image_mismatches: int = 0
    # Groups refused because a rule reward raised on one of their responses, or the rule
    # worker died scoring them (``workers.generation.rule_worker``; each logged with the reason).
    reward_errors: int = 0
    # The learner epoch of ``applied_version`` (``streamrl.clock``).
    weights_epoch: int = 0
    # Multi-turn episodes by how they ended (``stop``, ``length``, ``turns``, ``error``, ...)
    # and, for those that ended in error, by reason (``streamrl.envs``): totals of this process.
    episode_ends: dict[str, int] = {}
    episode_errors: dict[str, int] = {}
    # The newest scored groups (at most ``OUTCOME_WINDOW``) as (prompt index, flat: every
    # sample scored alike), and how many this incarnation scored in all: the difficulty
    # sampler's input (``controller.difficulty``).
    outcome_indices: list[int] = []
    outcome_flat: list[bool] = []
    outcomes_total: int = 0
    scoring: ScoringFigures = msgspec.field(default_factory=lambda: ScoringFigures())
    # Groups refused because their rules outran ``scoring.rule_timeout_s`` (the rule worker
    # was killed and started again), and the seconds the generator waited for rule scores:
    # totals of this process.
    reward_timeouts: int = 0
    rules_wait_s: float = 0.0
    # Probe sampling: the tokens of probes whose prompts were passed over (counted in
    # ``tokens_generated`` too; ``controller.generation_yield`` calls them lost to ``probe``).
    probe_tokens_passed_over: int = 0
    # Off-policy guidance (``algorithm.guidance``): the groups trained with their reference,
    # and the generated tokens of the samples the references displaced (lost to ``guidance``).
    groups_guided: int = 0
    guidance_tokens_displaced: int = 0
    # Screening (``generator.screen_samples``): the groups settled by their first samples
    # (delivered flat, their tokens lost to ``zero_variance``), and the samples they were spared.
    groups_settled_early: int = 0
    samples_spared: int = 0


class ShardReport(msgspec.Struct, tag="shard_report"):
    stats: ShardStats
    time: float


class EvalAnswer(msgspec.Struct):
    """One kept held-out response (``eval.keep_answers``, ``streamrl.eval_answers``):
    ``reward`` is the rules' combined score, ``served`` each served reward's by its label
    (None: unparsable or not answered in time)."""

    prompt_id: str
    question: str
    response: str
    ground_truth: str
    reward: float
    exact: bool
    stopped: bool
    served: dict[str, float | None] = {}


class EvalReport(msgspec.Struct, tag="eval_report"):
    """Held-out evaluation figures (``workers.generation.evaluator.evaluate``) of weights
    ``version`` of
    learner epoch ``weights_epoch``, asked for at ``requested`` (the generator may hold a newer
    version by then), with the responses kept (``answers``)."""

    generator_id: int
    requested: int
    version: int
    metrics: dict[str, float]
    time: float
    weights_epoch: int = 0
    answers: list[EvalAnswer] = []


class RewardRoleReport(msgspec.Struct, tag="reward_report"):
    """A reward role's totals (``workers.reward_roles.reward_role``), sent every second:
    the controller's ``/status``, ``summary.json`` and the bench read them."""

    index: int  # the reward's position in ``rewards:``
    incarnation: int
    label: str
    identity: str
    time: float
    requests: int = 0
    items: int = 0
    batches: int = 0
    busy_s: float = 0.0  # scoring (forward passes)
    up_s: float = 0.0  # since the scorer was ready
    queue_depth: int = 0  # requests received and not yet answered, now
    queue_wait_s: float = 0.0  # summed over requests: received -> its batch started
    latency_p50_s: float = 0.0  # received -> answered, over the newest requests
    latency_p95_s: float = 0.0
    failures: int = 0  # batches whose scoring raised (their requests answered with error)
    unparsable: int = 0  # items scored None
    malformed: int = 0  # frames that did not decode (counted, dropped)
    # Requests dropped unscored because their sender had given up on them (queued past
    # their ``expires_in_s``), and queued ones replaced by their sender's resend (same id).
    expired: int = 0
    replaced: int = 0
    # Requests refused because two incarnations of this role died scoring them.
    quarantined: int = 0
    # The ids of the requests in the batch being scored now (sent before the batch starts,
    # empty after it): if the role dies meanwhile, the controller knows whom to suspect.
    scoring_ids: list[str] = []


class ScoringFigures(msgspec.Struct):
    """A generator's side of scoring (``workers.generation.scoring``), totals of this process."""

    waiting: int = 0  # groups sampled and waiting for their scores, now
    sent: int = 0  # requests sent (first tries and retries)
    retries: int = 0  # requests sent again: past their timeout, or their role restarted
    timeouts: int = 0
    refused: int = 0  # groups given up (attempts used up, or an error reply), not pushed
    duplicates: int = 0  # replies to requests already answered (ignored)
    # Of ``refused``: a lagged teacher's copy was more than ``teacher.lag_bound`` behind.
    teacher_lagged: int = 0
    unparsable: dict[str, int] = {}  # per scorer label: items scored None (imputed, counted)
    wait_s: float = 0.0  # summed over scored groups: sampled -> every score in


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    """Sent every second by a thread of the role's process, whatever its main loop is doing:
    a process that stops sending (killed, SIGSTOPped) misses its heartbeats; one whose main
    loop is wedged (a forward, a hung reward) keeps sending them with ``stalled_s`` rising
    (``workers.progress``)."""

    role: str  # "generator"
    index: int
    incarnation: int
    time: float
    progress: int = 0  # steps of work made (decode steps, batches scored, versions adopted)
    stalled_s: float = 0.0  # seconds with work in hand and no step; 0 while idle


Report = (
    LearnerStep
    | GeneratorReport
    | ShardReport
    | EvalReport
    | Heartbeat
    | BatchTaken
    | RewardRoleReport
)
