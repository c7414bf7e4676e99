"""Idempotent takes: a learner whose batch reply was lost asks again and gets the same groups.

A shard marks a group consumed before the reply that carries it leaves (so no group is ever
handed out twice), which leaves one way to lose groups: the reply itself. It is lost when the
shard dies with it still in its socket, or when it comes after the client gave up waiting.
So every ``BatchRequest`` names its ``client`` (unique per ``BufferClient``) and a rising
``request_id``; the shard keeps each client's last take (the request id and the frames it
answered with), on its durable log too, and answers a repeat of that request id with the
same frames, taking nothing. A client that gets no reply sends the same request again until
one comes (``BufferClient``), so across a shard restart a take is delivered exactly once.

One take per client is enough: a client sends its next take to a shard only after the reply
to the previous one arrived. At most ``MAX_CLIENTS`` clients are kept (least recently taking
dropped first): learner ranks, and their restarts.

Example::

    takes = LastTakes()
    takes.put("learner0.3f2a", 7, frames)
    takes.answer("learner0.3f2a", 7)   # frames: a repeat, answer it again
    takes.answer("learner0.3f2a", 6)   # []: older than the last take, its reply is stale
    takes.answer("learner0.3f2a", 8)   # None: a new take
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

MAX_CLIENTS = 256

T = TypeVar("T")


@dataclass
class Take(Generic[T]):
    request_id: int
    items: list[T]  # the reply's frames (shard), or the groups' ids (log replay)


class LastTakes(Generic[T]):
    """The last take of each client, oldest client first."""

    def __init__(self, max_clients: int = MAX_CLIENTS) -> None:
        self.max_clients = max_clients
        self.by_client: OrderedDict[str, Take[T]] = OrderedDict()

    def put(self, client: str, request_id: int, items: list[T]) -> None:
        self.by_client.pop(client, None)
        self.by_client[client] = Take(request_id, items)
        while len(self.by_client) > self.max_clients:
            self.by_client.popitem(last=False)

    def extend(self, client: str, request_id: int, items: list[T]) -> None:
        """Add ``items`` to ``client``'s take ``request_id``, or start it (log replay: one
        take's rows may span record batches)."""
        last = self.by_client.get(client)
        if last is not None and last.request_id == request_id:
            last.items.extend(items)
        else:
            self.put(client, request_id, list(items))

    def answer(self, client: str, request_id: int) -> list[T] | None:
        """What to answer ``client``'s request ``request_id`` with, if it is not a new take:
        the same items for a repeat of the last take, none for an older request (its client
        has moved on, so the reply would be dropped)."""
        last = self.by_client.get(client)
        if last is None or request_id > last.request_id:
            return None
        return last.items if request_id == last.request_id else []

    def items(self) -> list[tuple[str, Take[T]]]:
        return list(self.by_client.items())
