"""A real reward role's loop (workers.reward_roles.reward_role) with a stand-in scorer, in this
process: one
bad request refuses only its own group, a resend is answered once, expired requests are
never scored, a request two incarnations died on is refused, and the controller hears which
requests a batch holds before it is scored."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from streamrl.config import Config, RewardSpec, ScoringConfig
from streamrl.protocol import RewardRoleReport, ScoreItemWire, ScoreReply, ScoreRequest
from streamrl.rewards.scorer import ScoreItem
from streamrl.role_specs import RewardRoleSpec
from streamrl.workers.reward_roles import reward_role

ENC = msgspec.msgpack.Encoder()


class _Scorer:
    identity = "rm@test"

    def __init__(self) -> None:
        self.seen: list[list[str]] = []
        self.stopped: list[list[bool]] = []
        self.gate = threading.Event()
        self.gate.set()

    def score(self, items: list[ScoreItem]) -> list[float | None]:
        self.gate.wait(5)
        self.seen.append([i.response for i in items])
        self.stopped.append([i.stopped for i in items])
        if any(i.response == "bad" for i in items):
            raise ValueError("cannot score 'bad'")
        return [float(len(i.response)) for i in items]


class _Harness:
    def __init__(self, tmp_path, monkeypatch, suspects: dict[str, int] | None = None) -> None:
        self.ctx = zmq.Context()
        self.reports = self.ctx.socket(zmq.PULL)
        port = self.reports.bind_to_random_port("tcp://127.0.0.1")
        self.scorer = _Scorer()
        monkeypatch.setattr(reward_role, "make_scorer", lambda *a, **k: self.scorer)
        config = Config(
            rewards=[RewardSpec(model="/models/rm")],
            scoring=ScoringConfig(batch_wait_ms=50, threads=1),
        )
        spec = RewardRoleSpec(
            log_file=str(tmp_path / "role.log"),
            bind_host="127.0.0.1",
            config=config,
            index=0,
            model_dir="/models/rm",
            report_endpoint=f"tcp://127.0.0.1:{port}",
            suspects=suspects or {},
        )
        self.role = reward_role.RewardRole(spec)
        self.thread = threading.Thread(target=self.role.serve, daemon=True)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(self.role.endpoint)

    def start(self) -> None:
        self.thread.start()

    def send(self, request_id: str, *responses: str, expires_in_s: float = 0.0) -> None:
        items = [ScoreItemWire("q", r) for r in responses]
        self.dealer.send(ENC.encode(ScoreRequest(request_id, items, expires_in_s)))

    def replies(self, n: int, timeout_s: float = 5.0) -> dict[str, ScoreReply]:
        out: dict[str, ScoreReply] = {}
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            if self.dealer.poll(50):
                reply = msgspec.msgpack.decode(self.dealer.recv(), type=ScoreReply)
                assert reply.request_id not in out, f"{reply.request_id} answered twice"
                out[reply.request_id] = reply
        assert len(out) == n, f"{len(out)} replies, want {n}"
        return out

    def report_ids(self) -> list[list[str]]:
        ids = []
        while self.reports.poll(0):
            frame = self.reports.recv()
            try:
                report = msgspec.msgpack.decode(frame, type=RewardRoleReport)
            except msgspec.ValidationError:
                continue  # a heartbeat
            ids.append(report.scoring_ids)
        return ids

    def close(self) -> None:
        self.role.stop()
        self.thread.join(timeout=5)
        self.role.close()
        self.ctx.destroy(linger=0)


@pytest.fixture
def harness(tmp_path, monkeypatch) -> Iterator[_Harness]:
    h = _Harness(tmp_path, monkeypatch)
    yield h
    h.close()


def test_one_bad_request_refuses_only_its_own_group(harness: _Harness) -> None:
    harness.send("g-0", "a", "bb")
    harness.send("g-1", "bad", "c")
    harness.send("g-2", "dddd")
    harness.start()  # all three queued: one batch
    replies = harness.replies(3)
    assert replies["g-0"].scores == [1.0, 2.0] and not replies["g-0"].error
    assert replies["g-1"].error == "ValueError: cannot score 'bad'" and not replies["g-1"].scores
    assert replies["g-2"].scores == [4.0] and not replies["g-2"].error
    assert harness.scorer.seen[0] == ["a", "bb", "bad", "c", "dddd"]  # first: one batch
    time.sleep(0.2)
    assert ["g-0", "g-1", "g-2"] in harness.report_ids()  # named before it was scored


def test_a_scorer_is_told_which_responses_were_cut_at_the_token_limit(harness: _Harness) -> None:
    items = [ScoreItemWire("q", "ended"), ScoreItemWire("q", "cut", stopped=False)]
    harness.dealer.send(ENC.encode(ScoreRequest("g-0", items)))
    harness.start()
    assert harness.replies(1)["g-0"].scores == [5.0, 3.0]
    assert harness.scorer.stopped == [[True, False]]


def test_a_resend_is_answered_once_and_expired_work_is_never_scored(harness: _Harness) -> None:
    harness.send("g-0", "aa", expires_in_s=0.05)  # its sender gives up before it is scored
    harness.send("g-1", "b", expires_in_s=30)
    harness.send("g-1", "b", expires_in_s=30)  # resent while the first still queues
    time.sleep(0.3)
    harness.start()
    replies = harness.replies(1)
    assert replies["g-1"].scores == [1.0]
    with pytest.raises(AssertionError):
        harness.replies(1, timeout_s=0.5)  # neither g-0 nor a second g-1
    assert harness.scorer.seen == [["b"]]
    harness.role._report()
    assert harness.role.figures.expired == 1 and harness.role.figures.replaced == 1


def test_a_request_two_incarnations_died_on_is_refused_and_a_suspect_scored_alone(
    tmp_path, monkeypatch
) -> None:
    h = _Harness(tmp_path, monkeypatch, suspects={"g-7": 2, "g-8": 1})
    try:
        h.send("g-7", "x")
        h.send("g-8", "y")
        h.send("g-9", "z")
        h.start()
        replies = h.replies(3)
        assert replies["g-7"].error.startswith("quarantined: 2 reward role(s) died")
        assert replies["g-8"].scores == [1.0] and replies["g-9"].scores == [1.0]
        assert h.scorer.seen == [["y"], ["z"]]  # the suspect in a batch of its own
        assert h.role.figures.quarantined == 1
    finally:
        h.close()
