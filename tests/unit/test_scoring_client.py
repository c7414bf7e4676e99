"""The generator's scoring client (workers.generation.scoring) against a ROUTER the test answers by
hand:
each group settled exactly once whatever is retried or answered twice, overdue requests sent
again, a restarted role's requests resent, refusals pushed marked ``unscored``."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq

from streamrl.config import Config, RewardSpec, ScoringConfig
from streamrl.protocol import ScoreReply, ScoreRequest, Trajectory, TrajectoryGroup
from streamrl.workers.generation.scoring import GroupScoring

ENC, DEC = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(ScoreRequest)


def _group(index: int, size: int = 2) -> TrajectoryGroup:
    trajectories = [
        Trajectory.from_lists(
            [1],
            [2, 3],
            [-0.1, -0.2],
            [0, 0],
            float("nan"),
            "stop" if j == 0 else "length",  # the second cut at the token limit
            0,
            response_text=f"answer {index}.{j}",
        )
        for j in range(size)
    ]
    return TrajectoryGroup(
        "", f"p{index}", trajectories, 0.0, 0.0, ground_truth="7", prompt_index=index
    )


class _Role:
    """A ROUTER standing in for a reward role: the test reads requests and answers them."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"

    def take(self, n: int, timeout_s: float = 5.0) -> list[tuple[bytes, ScoreRequest]]:
        got, deadline = [], time.monotonic() + timeout_s
        while len(got) < n and time.monotonic() < deadline:
            if self.sock.poll(50):
                peer, frame = self.sock.recv_multipart()
                got.append((peer, DEC.decode(frame)))
        assert len(got) == n, f"{len(got)} requests, want {n}"
        return got

    def answer(self, peer: bytes, request: ScoreRequest, error: str = "") -> None:
        scores = [] if error else [float(len(i.response)) for i in request.items]
        reply = ScoreReply(request.request_id, scores, "rm@abc", error)
        self.sock.send_multipart([peer, ENC.encode(reply)])


@pytest.fixture
def wiring():
    ctx = zmq.Context()
    role = _Role(ctx)
    settled: list[tuple[TrajectoryGroup, dict]] = []
    config = Config(
        rewards=[RewardSpec(name="numeric_match"), RewardSpec(model="/models/rm")],
        scoring=ScoringConfig(timeout_s=0.3, max_attempts=2),
    )

    def settle(group, served):
        settled.append((group, served))
        for t in group.trajectories:
            t.reward = served[1][0][0]

    client = GroupScoring(
        ctx, config, {1: role.endpoint}, "gen-a", lambda g: f"q{g.prompt_index}", settle
    )
    yield client, role, settled
    client.close()
    ctx.destroy(linger=0)


def _pump_until(client: GroupScoring, n: int, timeout_s: float = 5.0) -> list[TrajectoryGroup]:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += client.pump(wait_ms=20)
    return out


def test_a_group_waits_for_its_scores_and_is_settled_once(wiring) -> None:
    client, role, settled = wiring
    client.submit([_group(0), _group(1)])
    assert client.pending == 2 and client.pump() == []
    requests = role.take(2)
    assert [r.items[0].prompt for _, r in requests] == ["q0", "q1"]
    assert requests[0][1].items[1].response == "answer 0.1"
    assert [i.stopped for i in requests[0][1].items] == [True, False]
    # Answered out of order: the later group is pushed first, not held behind the earlier.
    # (One answer at a time: two answers sent together may land in one pump or in two.)
    role.answer(*requests[1])
    assert [g.prompt_index for g in _pump_until(client, 1)] == [1]
    assert client.pending == 1 and len(settled) == 1
    role.answer(*requests[0])
    assert [g.prompt_index for g in _pump_until(client, 1)] == [0]
    assert client.pending == 0 and len(settled) == 2
    assert settled[1][1] == {1: ([10.0, 10.0], "rm@abc")}
    role.answer(*requests[0])  # a second answer to the same request
    assert _pump_until(client, 1, timeout_s=0.5) == []
    assert client.figures.duplicates == 1 and len(settled) == 2


def test_an_overdue_request_is_sent_again_and_then_refused(wiring) -> None:
    client, role, settled = wiring
    client.submit([_group(3)])
    role.take(1)  # never answered
    time.sleep(0.35)
    assert client.pump() == []
    ((_, again),) = role.take(1)  # the retry
    time.sleep(0.35)
    (refused,) = _pump_until(client, 1)
    assert refused.unscored.startswith("rm-rm: no reply in 2 attempt(s)")
    assert client.figures.retries == 1 and client.figures.timeouts == 2
    assert client.figures.refused == 1 and not settled and client.pending == 0


def test_a_restarted_role_is_sent_what_was_in_flight_and_scores_it_once(wiring) -> None:
    client, role, settled = wiring
    client.submit([_group(5)])
    (first,) = role.take(1)
    client.take_epochs({1: 1})  # the role restarted: what it held is gone
    client.take_epochs({1: 1})  # the same epoch again: nothing more sent
    (second,) = role.take(1)
    assert second[1].request_id == first[1].request_id
    role.answer(*second)
    role.answer(*first)  # the old one answered too (it was not lost after all)
    assert len(_pump_until(client, 1)) == 1
    time.sleep(0.1)
    client.pump()
    assert len(settled) == 1 and client.figures.duplicates == 1


def test_an_error_reply_refuses_the_group_with_the_reason(wiring) -> None:
    client, role, settled = wiring
    client.submit([_group(6)])
    ((peer, request),) = role.take(1)
    role.answer(peer, request, error="ValueError: boom")
    (group,) = _pump_until(client, 1)
    assert group.unscored == "rm-rm: ValueError: boom"
    assert all(t.reward != t.reward for t in group.trajectories)  # NaN: the shard refuses it
    assert not settled


def test_a_malformed_reply_is_dropped_and_the_group_still_scored(wiring) -> None:
    client, role, settled = wiring
    client.submit([_group(7)])
    ((peer, request),) = role.take(1)
    role.sock.send_multipart([peer, b"\xc1garbage"])
    role.answer(peer, request)
    assert len(_pump_until(client, 1)) == 1 and len(settled) == 1


def test_an_evaluation_is_scored_without_waiting_and_reported_once(wiring) -> None:
    from streamrl.protocol import ScoreItemWire

    client, role, settled = wiring
    client.submit([_group(8)])
    got: list[dict] = []
    started = time.monotonic()
    client.score_later([ScoreItemWire("q", "abc", "7")], got.append)
    assert time.monotonic() - started < 0.05 and client.pending == 2  # returned at once
    group_request, eval_request = role.take(2)
    role.answer(*eval_request)  # the evaluation's scores first
    assert _pump_until(client, 1, timeout_s=0.3) == [] and got == [{1: ([3.0], "rm@abc")}]
    role.answer(*group_request)
    assert [g.prompt_index for g in _pump_until(client, 1)] == [8]
    assert client.pump() == [] and len(got) == 1 and len(settled) == 1 and client.pending == 0


def test_an_evaluation_nobody_answers_is_reported_without_its_scores(wiring) -> None:
    from streamrl.protocol import ScoreItemWire

    client, role, _ = wiring
    got: list[dict] = []
    client.score_later([ScoreItemWire("q", "abc", "7")], got.append)
    role.take(1)  # never answered, never resent
    client.pump()
    assert got == []
    time.sleep(0.35)  # scoring.timeout_s
    client.pump()
    assert got == [{}] and client.pending == 0
    with pytest.raises(AssertionError):
        role.take(1, timeout_s=0.2)


def test_a_request_tells_the_role_when_its_sender_gives_up(wiring) -> None:
    client, role, _ = wiring
    client.submit([_group(9)])
    ((_, request),) = role.take(1)
    assert request.expires_in_s == 0.3  # scoring.timeout_s: by then it is resent or refused
    time.sleep(0.35)
    client.pump()
    ((_, again),) = role.take(1)
    assert again.request_id == request.request_id  # a resend is the same request


def test_a_role_restarted_elsewhere_is_reached_at_its_new_endpoint(wiring) -> None:
    client, role, settled = wiring
    client.submit([_group(10)])
    role.take(1)  # the old role dies with it
    moved = _Role(zmq.Context.instance())
    try:
        client.take_epochs({1: 1}, {1: moved.endpoint})
        ((peer, request),) = moved.take(1)
        moved.answer(peer, request)
        assert [g.prompt_index for g in _pump_until(client, 1)] == [10]
        assert len(settled) == 1 and client.figures.retries == 1
        client.take_epochs({1: 1}, {1: moved.endpoint})  # the same again: nothing resent
        with pytest.raises(AssertionError):
            moved.take(1, timeout_s=0.2)
    finally:
        moved.sock.close(linger=0)


def test_a_lagged_teacher_hears_the_groups_version_and_its_lag_is_bounded() -> None:
    """A lagged teacher (``teacher.model: self``, docs/design.md §7d) is sent each group's
    newest behaviour version and epoch; an answer from a copy within ``lag_bound`` versions
    is kept, its version on every trajectory, and one further behind refuses the group
    (counted ``teacher_lagged``)."""
    from streamrl.config import TeacherSpec

    ctx = zmq.Context()
    role = _Role(ctx)
    config = Config(
        rewards=[
            RewardSpec(name="numeric_match"),
            RewardSpec(teacher=TeacherSpec(model="self", refresh_every=2), weight=0.5),
        ]
    )
    settled: list[TrajectoryGroup] = []
    client = GroupScoring(
        ctx, config, {1: role.endpoint}, "gen-a", lambda g: "q", lambda g, s: settled.append(g)
    )
    try:
        near, far = _group(0), _group(1)
        for group in (near, far):
            for t in group.trajectories:
                t.token_versions = b"\x07\x00\x00\x00" * 2  # sampled at version 7
            group.weights_epoch = 3
        client.submit([near, far])
        requests = role.take(2)
        assert [(r.version, r.weights_epoch) for _, r in requests] == [(7, 3), (7, 3)]
        for (peer, request), held in zip(requests, (6, 2), strict=True):  # lags 1 and 5 > 4
            reply = ScoreReply(
                request.request_id,
                [0.0] * len(request.items),
                "teacher-self@abc",
                token_logprobs=[b"\x00" * 8] * len(request.items),
                teacher_version=held,
            )
            role.sock.send_multipart([peer, ENC.encode(reply)])
        done: list[TrajectoryGroup] = []
        deadline = time.monotonic() + 5
        while len(done) < 2 and time.monotonic() < deadline:
            done += client.pump(50)
        assert settled == [near] and [t.teacher_version for t in near.trajectories] == [6, 6]
        assert "lags the group by 5 > 4" in far.unscored
        figures = client.snapshot()
        assert figures.refused == figures.teacher_lagged == 1
    finally:
        client.close()
        role.sock.close()
        ctx.term()
