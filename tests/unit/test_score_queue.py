"""A reward role's queue and batch rules (workers.reward_roles.score_queue): a resend replaces its
queued copy, expired requests are dropped, a suspect is scored alone, a request two incarnations
died on is refused, and an exception answers only the requests that raise."""

from __future__ import annotations

from streamrl.protocol import ScoreItemWire, ScoreRequest
from streamrl.rewards.scorer import ScoreItem
from streamrl.workers.reward_roles.score_queue import RequestQueue, score_batch


def _request(request_id: str, n: int = 1, expires_in_s: float = 0.0) -> ScoreRequest:
    items = [ScoreItemWire("q", f"{request_id}.{j}") for j in range(n)]
    return ScoreRequest(request_id, items, expires_in_s)


def _ids(batch) -> list[str]:
    return [p.request.request_id for p in batch]


def test_a_resend_replaces_its_queued_copy_in_place() -> None:
    queue = RequestQueue()
    queue.add(b"p", _request("g-0"), 0.0)
    queue.add(b"p", _request("g-1"), 0.0)
    queue.add(b"new", _request("g-0"), 5.0)  # resent from a reconnected socket
    assert len(queue) == 2 and queue.replaced == 1
    batch = queue.take(64, 6.0)
    assert _ids(batch) == ["g-0", "g-1"]  # once each, the resend in the original's place
    assert batch[0].peer == b"new" and batch[0].received == 5.0


def test_what_its_sender_gave_up_on_is_dropped_unscored() -> None:
    queue = RequestQueue()
    queue.add(b"p", _request("g-0", expires_in_s=1.0), 0.0)
    queue.add(b"p", _request("g-1", expires_in_s=1.0), 0.5)
    queue.add(b"p", _request("g-2"), 0.0)  # 0: its sender waits for ever
    assert _ids(queue.take(64, 1.2)) == ["g-1", "g-2"]
    assert queue.expired == 1 and len(queue) == 0


def test_a_batch_stops_at_max_items_and_a_suspect_goes_alone() -> None:
    queue = RequestQueue(suspects={"g-2": 1, "g-9": 2})
    for i in range(5):
        queue.add(b"p", _request(f"g-{i}", n=3), 0.0)
    queue.add(b"p", _request("g-9"), 0.0)
    assert [p.request.request_id for p in queue.quarantined] == ["g-9"]
    assert _ids(queue.take(7, 0.0)) == ["g-0", "g-1"]  # 6 items; a third would pass 7
    assert _ids(queue.take(64, 0.0)) == ["g-2"]  # one death: scored on its own
    assert _ids(queue.take(64, 0.0)) == ["g-3", "g-4"]


def test_an_exception_answers_only_the_requests_that_raise() -> None:
    calls = []

    def score(items: list[ScoreItem]) -> list[float | None]:
        calls.append(len(items))
        if any(i.response == "bad" for i in items):
            raise ValueError("cannot score 'bad'")
        return [float(len(i.response)) for i in items]

    requests = [[ScoreItem("q", "a")], [ScoreItem("q", "bb"), ScoreItem("q", "bad")]]
    requests += [[ScoreItem("q", "cccc")], [ScoreItem("q", "ddddd")]]
    answers, failed = score_batch(score, requests)
    assert answers == [
        ([1.0], ""),
        ([], "ValueError: cannot score 'bad'"),
        ([4.0], ""),
        ([5.0], ""),
    ]
    assert failed == 3 and calls == [5, 3, 1, 2, 2]  # whole, left half, its halves, right


def test_a_wrong_count_of_scores_is_an_error_of_its_request_only() -> None:
    def score(items: list[ScoreItem]) -> list[float | None]:
        return [1.0] * (len(items) - any(i.response == "short" for i in items))

    answers, _ = score_batch(score, [[ScoreItem("q", "a")], [ScoreItem("q", "short")]])
    assert answers == [([1.0], ""), ([], "ValueError: 0 scores for 1 responses")]


def test_a_wire_item_is_a_score_item_field_for_field() -> None:
    """The reward role turns each ``ScoreItemWire`` into a ``ScoreItem`` by position
    (``ScoreItem(*astuple(wire))``): the two must name the same fields in the same order."""
    import dataclasses

    from msgspec.structs import astuple

    assert ScoreItemWire.__struct_fields__ == tuple(f.name for f in dataclasses.fields(ScoreItem))
    wire = ScoreItemWire("q", "r", "7", b"\x01", b"\x02", 0.7, stopped=False)
    item = ScoreItem(*astuple(wire))
    assert item == ScoreItem("q", "r", "7", b"\x01", b"\x02", 0.7, stopped=False)
