"""The generator's optional parts, each alone: ``Delivery`` with and without served scoring
(``workers.generation.generator_delivery``), ``HeldOutEvaluations`` with an evaluation process that
answers, abandons and dies (``workers.generation.generator_evaluations``), and the evaluation
process's
typed pipe messages (``workers.generation.eval_process``)."""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import msgspec
import zmq
from test_scoring_client import _group, _Role

from streamrl.config import Config, RewardSpec, ScoringConfig
from streamrl.evaluation import EvalResult
from streamrl.protocol import Directives, LearnerClockInfo, Receipts, ScoringFigures
from streamrl.workers.generation.eval_process import (
    Abandoned,
    ClockNews,
    Close,
    EvalAsk,
    Evaluated,
    FromProcess,
    LastFigures,
    Ready,
    ToProcess,
    hold_at,
)
from streamrl.workers.generation.generator_delivery import Delivery, NoScoring
from streamrl.workers.generation.generator_evaluations import HeldOutEvaluations, NoProcess
from streamrl.workers.generation.generator_sockets import ShardPushers
from streamrl.workers.generation.scoring import GroupScoring


class _Pusher:
    def __init__(self) -> None:
        self.prompts: list[int] = []
        self.decoder = msgspec.msgpack.Decoder()

    def send(self, frame: bytes) -> None:
        self.prompts.append(self.decoder.decode(frame)["prompt_index"])


def test_the_evaluation_process_speaks_typed_messages() -> None:
    """Each pipe message survives msgpack as the Struct it was (no pickle on the pipe)."""
    result = EvalResult(7, {"eval/accuracy": 0.5}, [{"prompt_id": "e0", "reward": 1.0}])
    to_process = [ClockNews(LearnerClockInfo(3, 1)), EvalAsk(7, 1, False, True), Close()]
    from_process = [Ready(), Evaluated(7, 1, result, 1), Abandoned(5, 0)]
    encode = msgspec.msgpack.Encoder().encode
    to_decoder = msgspec.msgpack.Decoder(ToProcess)
    from_decoder = msgspec.msgpack.Decoder(FromProcess)
    assert [to_decoder.decode(encode(m)) for m in to_process] == to_process
    assert [from_decoder.decode(encode(m)) for m in from_process] == from_process


def test_the_process_holds_its_weights_at_the_next_evaluation_due() -> None:
    """Between an answer and the next ask the engine waits at the next scheduled version,
    counted from the last answer: it reached v20 before v20's ask came, and a hold counted
    from its own version let it move to v25, so v20 was never evaluated."""
    every = 5
    assert hold_at([], answered=-1, every=every) == 0  # before training
    # 20 whatever the engine holds: it reaches v20 before v20's ask comes.
    assert hold_at([], answered=15, every=every) == 20
    assert hold_at([EvalAsk(20, 0, False, False)], answered=15, every=every) == 20
    # A lagging process answers the asks in order: it holds at the oldest.
    asks = [EvalAsk(10, 0, False, False), EvalAsk(15, 0, False, False)]
    assert hold_at(asks, answered=5, every=every) == 10
    # After a fork back to v32 (ClockNews: the answered version falls to the clock's), v35.
    assert hold_at([], answered=min(40, 32), every=every) == 35


def test_an_ask_the_same_weights_answer_gets_their_figures_without_a_second_pass() -> None:
    """A starved process that holds v40 answers its v5 and v10 asks with v40's weights: one
    pass, the second ask gets the same figures; other weights, another epoch or an unseen
    wording the last pass did not ask for are evaluated."""
    last = LastFigures()
    assert last.get(40, 0, unseen=False) is None  # nothing evaluated yet
    figures = EvalResult(40, {"eval/exact_match": 0.5})
    last.put(40, 0, False, figures)
    assert last.get(40, 0, unseen=False) is figures
    assert last.get(41, 0, unseen=False) is None
    assert last.get(40, 1, unseen=False) is None  # a restarted learner group's v40
    assert last.get(40, 0, unseen=True) is None  # the final ask's unseen wording
    last.put(40, 0, True, figures)
    assert last.get(40, 0, unseen=False) is figures


def test_delivery_without_served_rewards_pushes_each_group_at_once() -> None:
    shard = _Pusher()
    delivery = Delivery(ShardPushers([shard], "gen-0", 0), NoScoring())
    delivery.deliver([_group(3), _group(4)], delivery.take_grant(2))
    assert shard.prompts == [3, 4] and delivery.groups_pushed == 2 and delivery.pending == 0
    assert delivery.snapshot() == ScoringFigures()
    done: list[dict] = []

    def unread() -> dict[str, str]:
        raise AssertionError("the held-out set was read")

    delivery.score_responses([{"prompt_id": "e0"}], unread, done.append)
    assert done == [{}]  # the evaluation's report goes at once, the held-out set unread


def test_delivery_pushes_a_refused_group_at_once_and_the_others_once_scored() -> None:
    ctx = zmq.Context()
    role = _Role(ctx)
    config = Config(rewards=[RewardSpec(model="/models/rm")], scoring=ScoringConfig(timeout_s=30))
    scoring = GroupScoring(ctx, config, {0: role.endpoint}, "gen-0", lambda g: "q", lambda *_: None)
    shard = _Pusher()
    delivery = Delivery(ShardPushers([shard], "gen-0", 0), scoring)
    try:
        refused, waits = _group(1), _group(2)
        refused.unscored = "the rules refused it"
        delivery.deliver([refused, waits], delivery.take_grant(2))
        assert shard.prompts == [1] and delivery.pending == 1  # only the other is scored
        ((peer, request),) = role.take(1)
        role.answer(peer, request)
        deadline = time.monotonic() + 5
        while delivery.pending and time.monotonic() < deadline:
            delivery.wait(20)
        assert shard.prompts == [1, 2]
        delivery.take_receipts(Receipts(delivered={0: 1}))  # acknowledged: forgotten
        assert not delivery.pushers.outboxes[0].unacked
    finally:
        delivery.close()
        ctx.destroy(linger=0)


class _Process:
    """An evaluation process the test answers by hand; ``dead`` once it 'crashed'."""

    in_process, exitcode = True, -9

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []
        self.answers: list[Evaluated | Abandoned] = []
        self.dead = False

    def follow_clock(self, clock: LearnerClockInfo) -> None:
        pass

    def ask(self, version: int, epoch: int, final: bool, unseen: bool) -> bool:
        self.asked.append((epoch, version))
        return not self.dead

    def take(self, timeout_s: float = 0.0) -> list[Evaluated | Abandoned]:
        out, self.answers = self.answers, []
        return out

    def exited(self) -> bool:
        return self.dead

    shut = open = close = lambda self: None


def test_evaluations_go_to_the_process_and_inline_once_it_died() -> None:
    sent: list = []
    process = _Process()
    reporting = SimpleNamespace(
        send_eval=sent.append,
        timing=lambda activity: contextlib.nullcontext(),
        progress=SimpleNamespace(working=contextlib.nullcontext),
    )
    evaluations = HeldOutEvaluations(
        Config(),
        0,
        tokenizer=None,
        weights=None,
        reporting=reporting,
        delivery=Delivery(ShardPushers([], "gen-0", 0), NoScoring()),
        admission=None,
        run_goes_on=lambda: True,
        process=process,
    )
    inline: list[tuple[int, int]] = []
    evaluations.evaluate = lambda version, epoch, final=False: inline.append((epoch, version))
    clock = LearnerClockInfo(4, 0)
    evaluations.obey(Directives(eval_version=2))
    evaluations.obey(Directives(eval_version=2))  # in flight: not asked twice
    assert process.asked == [(0, 2)] and evaluations.dispatched == (0, 2)
    process.answers = [Evaluated(2, 0, EvalResult(2, {"eval/accuracy": 1.0}), 0)]
    evaluations.follow(clock)
    assert evaluations.evaluated == (0, 2) and [r.version for r in sent] == [2]
    evaluations.obey(Directives(eval_version=4))
    process.answers = [Abandoned(4, 0)]  # those weights are gone: the controller asks again
    evaluations.follow(clock)
    assert evaluations.dispatched == (0, 2) and len(sent) == 1
    process.dead = True
    evaluations.follow(clock)  # the process exited: evaluations run inline from now on
    assert isinstance(evaluations.process, NoProcess)
    evaluations.obey(Directives(eval_version=4))
    assert inline == [(0, 4)] and process.asked == [(0, 2), (0, 4)]
