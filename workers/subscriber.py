"""Generator side of weight streaming (DESIGN.md §4).

The subscriber holds a full bf16 image of the model (for the HF engine it *is* the engine's
parameters, so applying a diff updates the engine with no copy). It receives every learner
rank's shard diffs over SUB, reassembles them and moves the image from version ``v`` to a
later version only when **every** rank's rows can reach that version, so the engine never
runs a model whose rows come from two versions.

Recovery: a rank whose diffs no longer chain onto the rows we hold (a missed chunk, PUB
high-water mark, a late join, a checksum mismatch) is asked for an anchor, a full snapshot
of its shard; diffs newer than the anchor chain on from it.

Invariant: a diff with ``base_version = b`` is applied only to rows at version ``b``, and
every new row is checked against its checksum before any row is written.
Example: holding v3, diffs v4 (base 3) and v5 (base 4) arrive from all ranks -> one ``poll``
moves to v5; if rank 1's v4 was lost, rank 1 is re-anchored at v5 and the image moves to v5.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
import zmq

from streamrl.protocol import AnchorRequest, TensorPart, WeightAnchor, WeightDiff, WeightMessage
from streamrl.transport import Codec, make_socket
from streamrl.workers.weight_codec import apply_part

log = logging.getLogger(__name__)


@dataclass
class _RankState:
    version: int
    diffs: dict[int, dict[int, WeightDiff]] = field(default_factory=dict)  # version -> chunks
    anchor: dict[int, WeightAnchor] = field(default_factory=dict)  # chunk -> anchor chunk
    anchor_requested_at: float | None = None

    def complete_diff(self, version: int) -> list[WeightDiff] | None:
        chunks = self.diffs.get(version)
        if not chunks or len(chunks) != next(iter(chunks.values())).num_chunks:
            return None
        return [chunks[i] for i in range(len(chunks))]

    def complete_anchor(self) -> list[WeightAnchor] | None:
        if not self.anchor:
            return None
        first = next(iter(self.anchor.values()))
        versions = {a.version for a in self.anchor.values()}
        if len(versions) != 1 or len(self.anchor) != first.num_chunks:
            return None
        return [self.anchor[i] for i in range(first.num_chunks)]

    def plan(self, target: int) -> list[list[TensorPart]] | None:
        """The parts that bring this rank's rows to ``target``, or None if it cannot."""
        start, steps = self.version, []
        anchor = self.complete_anchor()
        if anchor is not None and self.version < anchor[0].version <= target:
            start = anchor[0].version
            steps.append([p for a in anchor for p in a.parts])
        for v in range(start + 1, target + 1):
            diff = self.complete_diff(v)
            if diff is None or diff[0].base_version != v - 1:
                return None
            steps.append([p for d in diff for p in d.parts])
        return steps


class WeightSubscriber:
    def __init__(
        self,
        image: dict[str, torch.Tensor],
        pub_endpoints: list[str],
        anchor_endpoints: list[str],
        subscriber_id: int,
        *,
        version: int = 0,
        anchor_timeout_s: float = 10.0,
        ctx: zmq.Context | None = None,
    ) -> None:
        self.image, self.subscriber_id = image, subscriber_id
        self.version = version
        self.anchor_timeout_s = anchor_timeout_s
        self.ctx = ctx or zmq.Context.instance()
        self.sub = make_socket(self.ctx, zmq.SUB, rcvhwm=0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        for endpoint in pub_endpoints:
            self.sub.connect(endpoint)
        self.dealers = []
        for endpoint in anchor_endpoints:
            dealer = make_socket(self.ctx, zmq.DEALER, rcvhwm=0)
            dealer.connect(endpoint)
            self.dealers.append(dealer)
        self.codec: Codec[WeightMessage] = Codec(WeightMessage, f"subscriber[{subscriber_id}]")
        self.ranks = [_RankState(version) for _ in anchor_endpoints]
        self.verified_versions: list[int] = []
        self.checksum_failures = 0
        self.anchors_applied = 0
        self.last_progress = time.monotonic()

    # ------------------------------------------------------------------ receiving

    def _stage(self, msg: WeightMessage | None) -> None:
        if msg is None or not 0 <= msg.rank < len(self.ranks):
            return
        state = self.ranks[msg.rank]
        match msg:
            case WeightDiff(version=v, chunk=c) if v > state.version:
                state.diffs.setdefault(v, {})[c] = msg
            case WeightAnchor(version=v, chunk=c):
                if c == 0 or any(a.version != v for a in state.anchor.values()):
                    state.anchor = {}
                state.anchor[c] = msg

    def _drain(self) -> None:
        while True:
            try:
                self._stage(self.codec.decode(self.sub.recv(zmq.NOBLOCK, copy=False)))
            except zmq.Again:
                break
        for dealer in self.dealers:
            while True:
                try:
                    self._stage(self.codec.decode(dealer.recv(zmq.NOBLOCK, copy=False)))
                except zmq.Again:
                    break

    def request_anchor(self, rank: int) -> None:
        state = self.ranks[rank]
        now = time.monotonic()
        if state.anchor_requested_at is not None and now - state.anchor_requested_at < 5.0:
            return  # one request in flight is enough
        state.anchor_requested_at = now
        state.anchor = {}
        self.dealers[rank].send(self.codec.encode(AnchorRequest(self.subscriber_id)))
        log.info("subscriber[%d]: requested anchor from rank %d", self.subscriber_id, rank)

    def _detect_gaps(self) -> None:
        # One publisher's messages arrive in order, so a complete diff that does not chain
        # onto our rows proves something between was lost (or we joined late).
        for rank, state in enumerate(self.ranks):
            complete = [v for v in state.diffs if state.complete_diff(v) is not None]
            if complete and state.complete_anchor() is None and state.plan(max(complete)) is None:
                self.request_anchor(rank)

    # ------------------------------------------------------------------ applying

    def poll(self, learner_version: int | None = None) -> list[str]:
        """Receive what arrived and move to the newest version every rank can reach.
        Returns the names of tensors that changed (empty if the version did not move)."""
        self._drain()
        self._detect_gaps()
        candidates = sorted(
            {v for s in self.ranks for v in s.diffs}
            | {a.version for s in self.ranks for a in s.anchor.values()},
            reverse=True,
        )
        for target in (v for v in candidates if v > self.version):
            plans = [state.plan(target) for state in self.ranks]
            if all(p is not None for p in plans):
                return self._apply(target, plans)
        self._maybe_catch_up(learner_version)
        return []

    def _apply(self, target: int, plans: list[list[list[TensorPart]]]) -> list[str]:
        # Phase 1: compute and verify every new row block; nothing is written on failure.
        staged: dict[tuple[str, int], torch.Tensor] = {}
        for rank, steps in enumerate(plans):
            try:
                for parts in steps:
                    for part in parts:
                        key = (part.name, part.row_offset)
                        base = staged.get(key)
                        if base is None:
                            base = self._rows(part)
                        staged[key] = apply_part(part, base)
            except (ValueError, KeyError) as exc:
                self.checksum_failures += 1
                log.warning("subscriber[%d]: rank %d rejected: %s", self.subscriber_id, rank, exc)
                self.ranks[rank].diffs.clear()
                self.ranks[rank].anchor_requested_at = None
                self.request_anchor(rank)
                return []
        # Phase 2: write.
        for (name, offset), rows in staged.items():
            self.image[name][offset : offset + rows.shape[0]].copy_(rows)
        for rank, state in enumerate(self.ranks):
            if plans[rank] and state.complete_anchor() is not None:
                self.anchors_applied += 1
                state.anchor, state.anchor_requested_at = {}, None
            state.version = target
            state.diffs = {v: c for v, c in state.diffs.items() if v > target}
        self.version = target
        self.verified_versions.append(target)
        self.last_progress = time.monotonic()
        return sorted({name for name, _ in staged})

    def _rows(self, part: TensorPart) -> torch.Tensor:
        full = self.image[part.name]
        if tuple(full.shape) != tuple(part.full_shape):
            raise ValueError(f"{part.name}: shape {tuple(part.full_shape)} != {tuple(full.shape)}")
        return full[part.row_offset : part.row_offset + part.rows]

    def _maybe_catch_up(self, learner_version: int | None) -> None:
        """Nothing arrives but the learner is ahead (e.g. the last diff was dropped): anchor."""
        if learner_version is None or learner_version <= self.version:
            self.last_progress = time.monotonic()
            return
        if time.monotonic() - self.last_progress > self.anchor_timeout_s:
            for rank in range(len(self.ranks)):
                self.request_anchor(rank)
            self.last_progress = time.monotonic()

    def close(self) -> None:
        self.sub.close()
        for dealer in self.dealers:
            dealer.close()
