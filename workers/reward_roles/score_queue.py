"""A reward role's queue and its batch scoring (docs/design.md §7c), apart from sockets and
models so that their rules are tested alone.

``RequestQueue``: requests in arrival order, one entry per request id. A resend (the same
id: the sender's timeout passed, or the role restarted) replaces the queued entry in its
place, never adds a second (``replaced``); a request still queued ``expires_in_s`` after it
arrived is dropped unscored when a batch is taken (``expired``): its sender has sent it again
or given its group up, so scoring it would only add to the queue that made it late. A request
that two incarnations of the role died scoring is answered with an error, never scored
(``quarantined``); one that one incarnation died scoring is scored in a batch of its own, so
that a second death names it alone.

``score_batch``: a batch whose scoring raises is split in halves, each scored again, down to
single requests, so an exception answers only the request(s) that raise with the error and
the rest of the batch with their scores (2 log2 N extra calls for one bad request of N).

Example: requests a, b, c queued; b resent (its entry replaced, still second); a's sender
gave up meanwhile: the next batch is [b, c] and a counts as expired. Scoring [b, c] raises
because of c: b is answered with scores, c with the error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamrl.protocol import ScoreRequest
from streamrl.rewards.scorer import ScoreItem
from streamrl.role_specs import QUARANTINE_AFTER


@dataclass
class Pending:
    peer: bytes
    request: ScoreRequest
    received: float  # monotonic, on this role's clock

    @property
    def expired_at(self) -> float:
        timeout = self.request.expires_in_s
        return self.received + timeout if timeout > 0 else float("inf")


class RequestQueue:
    """Queued requests by id, oldest first (module doc).

    Invariant: at most one entry per request id; ``take`` never returns an expired or a
    quarantined request, and returns a suspect (one death) only as a batch of its own.

    Example::

        queue = RequestQueue(suspects={"g-7": 1})
        queue.add(peer, request, now)          # request.request_id "g-3"
        queue.add(peer, request, now + 1)      # its resend: replaced, still one entry
        batch = queue.take(64, now + 2)        # [g-3]
    """

    def __init__(self, suspects: dict[str, int] | None = None) -> None:
        self.entries: OrderedDict[str, Pending] = OrderedDict()
        self.suspects = dict(suspects or {})
        self.expired = self.replaced = 0
        self.quarantined: list[Pending] = []  # to be answered with an error by the role

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, peer: bytes, request: ScoreRequest, now: float) -> None:
        """Queue a request; a resend of a queued id takes its place (fresh deadline, the
        sender's current socket)."""
        request_id = request.request_id
        if self.suspects.get(request_id, 0) >= QUARANTINE_AFTER:
            self.quarantined.append(Pending(peer, request, now))
            return
        if request_id in self.entries:
            self.replaced += 1
        self.entries[request_id] = Pending(peer, request, now)  # an existing key keeps its place

    def take(self, max_items: int, now: float) -> list[Pending]:
        """The oldest live requests, up to ``max_items`` responses (at least one request
        whole); expired ones on the way are dropped and counted. A suspect goes alone."""
        batch: list[Pending] = []
        size = 0
        while self.entries:
            request_id, pending = next(iter(self.entries.items()))
            if pending.expired_at <= now:
                del self.entries[request_id]
                self.expired += 1
                continue
            n = len(pending.request.items)
            suspect = request_id in self.suspects
            if batch and (suspect or size + n > max_items):
                break
            del self.entries[request_id]
            batch.append(pending)
            size += n
            if suspect:
                break
        return batch


# (one request's scores, or [] with the error) per request of a batch
Answer = tuple[list[float | None], str]


def score_batch(
    score: Callable[[list[ScoreItem]], Sequence[float | None]],
    requests: list[list[ScoreItem]],
) -> tuple[list[Answer], int]:
    """Each request's scores from as few ``score`` calls as the errors allow (module doc);
    returns the answers in order and how many calls raised.

    Example: ``score_batch(f, [[a], [b, c]])`` where f raises on c: ``([([s_a], ""), ([],
    "ValueError: ...")], 2)`` (the whole batch raised, then the second half alone)."""
    if not requests:
        return [], 0
    items = [item for request in requests for item in request]
    try:
        scores = list(score(items)) if items else []
        if len(scores) != len(items):
            raise ValueError(f"{len(scores)} scores for {len(items)} responses")
    except Exception as exc:  # a scorer bug or a bad input must not end the role
        if len(requests) == 1:
            return [([], f"{type(exc).__name__}: {exc}"[:300])], 1
        half = len(requests) // 2
        left, left_failed = score_batch(score, requests[:half])
        right, right_failed = score_batch(score, requests[half:])
        return left + right, 1 + left_failed + right_failed
    answers, offset = [], 0
    for request in requests:
        answers.append((scores[offset : offset + len(request)], ""))
        offset += len(request)
    return answers, 0
