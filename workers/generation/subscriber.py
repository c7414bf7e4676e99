"""Generator side of weight streaming (docs/design.md §4).

The subscriber holds a full bf16 image of the model (for the HF engine it *is* the engine's
parameters, so applying a diff updates the engine with no copy). It receives every learner
rank's block diffs over one SUB socket, reassembles the rows (each rank owns the FSDP2 dim-0
rows ``shard_rows`` gives it; each part names its ``row_offset``) and moves the image from
version ``v`` to a later version only when **every** rank's rows can reach that version, so
the engine never runs a model whose rows come from two versions.

Ordering: a rank's diffs form a chain, each ``WeightDiff`` naming the ``base_version`` it
applies to (``version - 1``, or older when the publisher coalesced versions). A rank's rows can
reach version ``t`` if a chain of complete diffs leads from the version we hold (or from a
complete anchor) to ``t``; the subscriber moves to the newest version all ranks can reach.

Recovery: a rank whose diffs cannot reach the others' is asked for an anchor, a full snapshot
of its shard, and the diffs after it chain on from it. Triggers: a complete diff that does not
chain (a whole message lost, or a late join), a hole in the rank's chunk sequence (one
publisher's messages arrive in order, so chunk 3 after chunk 1 proves chunk 2 was dropped), a
diff left incomplete for ``anchor_timeout_s``, a newer version being known (from the learner's
version the caller passes, or from another rank's messages) with no progress for
``anchor_timeout_s`` (a rank whose last messages were all dropped says nothing), and a
checksum mismatch.

Whole-image verification (``weights.verify_every``): a version whose diff carries an
``ImageChecksum`` has that rank's rows hashed again once they are at that version (also in the
middle of a multi-version ``poll``), every byte, nothing cached trusted. A mismatch (a block that
diverged silently, which no diff touched since) is counted, logged, and repaired: the rank is
asked for an anchor and, until one at our version or later is applied, its diffs are not
applied (the image stays where it is; an anchor at the version we hold is applied in place).

Invariant: a diff with ``base_version = b`` is applied only to rows at version ``b``, and the
image moves to a version whole or not at all: blocks are written in place and each is checked
against its checksum as it is written; on any failure an undo log (the old values at the
changed positions) puts every block back before ``poll`` returns. ``poll`` runs between decode
steps, so the engine never sees a half-applied version.

Writing ahead (``write_ahead``, where nothing decodes with the image: a weight thread's
own copy): the publisher streams a version's chunks as it encodes them, and each ``poll``
writes the chunks that arrived of each rank's diff from the version held (in chunk order,
each block verified, its undo records kept) without moving the version. When the version is
whole only the last chunks are left to write, so writing overlaps the publisher's encoding
instead of following it. The version still moves whole or not at all: ``_apply`` takes the
written-ahead parts as its first step's and undoes them on any failure, and a diff written
ahead that the version taken does not start with (an anchor came instead, its messages were
dropped) is undone first. ``close`` undoes one left half-written. So between polls a rank's
rows may be ahead of the version held (written, waiting for the rest or for the other
ranks): only the thread that polls may read the image, and only what a ``poll`` that moved
the version returned, which is then whole.

Example: holding v3, diffs v4 (base 3) and v5 (base 4) arrive from all ranks -> one ``poll``
moves to v5; if rank 1's v4 was lost, rank 1 is re-anchored at v5 (or later) and the image
moves to the newest version both ranks reach.

The image lives in host memory (a GPU engine gets the changed tensors via ``update_weights``).
Memory: besides the image, diffs received but not yet applied, and during ``poll`` the undo
log: the old values at the changed positions, plus a copy of the rows a dense part replaces
(an anchor: transiently the size of that rank's shard).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Executor

import numpy as np
import torch
import zmq

from streamrl.protocol import (
    AnchorRequest,
    ImageChecksum,
    WeightAnchor,
    WeightDiff,
    WeightMessage,
    WeightStages,
)
from streamrl.transport import Codec, make_socket
from streamrl.workers.generation.rank_stream import (
    AheadWrite,
    ChunkMessage,
    RankStream,
    Steps,
)
from streamrl.workers.weight_codec import (
    EncodedPart,
    Undo,
    apply_in_place,
    as_i16,
    image_checksum,
    image_digests,
    shard_rows,
    undo,
)

log = logging.getLogger(__name__)

ANCHOR_RETRY_S = 5.0  # an anchor request unanswered this long may be sent again
MAX_STAGED_VERSIONS = 256  # per rank; beyond this the oldest are dropped (an anchor repairs)


def _overlapping(parts: list[EncodedPart]) -> bool:
    """Whether two parts write rows of the same tensor in common."""
    spans = sorted((p.header.name, p.header.row_offset, p.header.rows) for p in parts)
    return any(a[0] == b[0] and a[1] + a[2] > b[1] for a, b in zip(spans, spans[1:], strict=False))


class WeightSubscriber:
    def __init__(
        self,
        image: dict[str, torch.Tensor],
        pub_endpoints: list[str],
        anchor_endpoints: list[str],
        subscriber_id: int,
        *,
        version: int = 0,
        anchor_timeout_s: float = 5.0,
        rcvhwm: int = 0,
        ctx: zmq.Context | None = None,
        pool: Executor | None = None,
        write_ahead: bool = False,
    ) -> None:
        """``pool``: threads a version's blocks are applied on (``streamrl.cores.burst_pool``;
        None: on the calling thread). ``write_ahead``: write a diff's chunks into the image as
        they arrive (module doc); only where nothing reads the image between polls (a weight
        thread's own image, not an engine's parameters that it decodes with)."""
        for name, tensor in image.items():
            if tensor.dtype != torch.bfloat16 or not tensor.is_contiguous() or tensor.is_cuda:
                raise ValueError(f"{name}: the image must be contiguous bf16 tensors on the host")
        self.image, self.subscriber_id = image, subscriber_id
        self.pool = pool
        self.write_ahead = write_ahead
        self.last_ahead_s = 0.0  # the last version's seconds written ahead of its last chunk
        # Whether the last version taken was each rank's written-ahead diff alone (the image's
        # tensors are then exactly what ``ahead_final`` said they would be).
        self.took_ahead = False
        # What the last ``poll`` that moved the image wrote: every applied part's undo record
        # (``weight_codec.changed_elements`` reads which elements changed from them); empty
        # after a poll that moved nothing.
        self.last_records: list[Undo] = []
        self.version = version
        self.anchor_timeout_s = anchor_timeout_s
        self.ctx = ctx or zmq.Context.instance()
        self.sub = make_socket(self.ctx, zmq.SUB, rcvhwm=rcvhwm)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        for endpoint in pub_endpoints:
            self.sub.connect(endpoint)
        self.dealers = []
        for endpoint in anchor_endpoints:
            dealer = make_socket(self.ctx, zmq.DEALER, rcvhwm=0)
            dealer.connect(endpoint)
            self.dealers.append(dealer)
        self.codec: Codec[WeightMessage] = Codec(WeightMessage, f"subscriber[{subscriber_id}]")
        self.ranks = [RankStream() for _ in anchor_endpoints]
        self.verified_versions: list[int] = []
        self.checksum_failures = 0
        self.images_verified = 0
        self.image_mismatches = 0
        self.last_verify_s = 0.0
        self.anchors_requested = 0
        self.anchors_applied = 0
        self.bytes_received = 0
        self.last_apply_s = 0.0
        self.last_latency_s = 0.0
        # (version, wall time applied, apply seconds, publish-to-applied seconds)
        self.history: deque[tuple[int, float, float, float]] = deque(maxlen=10_000)
        self.last_progress = time.monotonic()
        self.newest_seen = version  # the newest version any rank has sent us
        # Wall time each staged version's newest chunk arrived (any rank), and the stages of
        # the last version applied: publish -> all in, all in -> applying, applying.
        self._arrived: dict[int, float] = {}
        self.last_stages = WeightStages()

    def metrics(self) -> dict[str, float]:
        return {
            "weights/applied_version": float(self.version),
            "weights/apply_s": self.last_apply_s,
            "weights/ahead_s": self.last_ahead_s,
            "weights/publish_to_applied_s": self.last_latency_s,
            "weights/bytes_received": float(self.bytes_received),
            "weights/checksum_failures": float(self.checksum_failures),
            "weights/anchors_requested": float(self.anchors_requested),
            "weights/anchors_applied": float(self.anchors_applied),
            "weights/images_verified": float(self.images_verified),
            "weights/image_mismatches": float(self.image_mismatches),
            "weights/verify_s": self.last_verify_s,
        }

    # ------------------------------------------------------------------ receiving

    def _receive(self, frames: list[zmq.Frame]) -> ChunkMessage | None:
        self.bytes_received += sum(len(f) for f in frames)
        header = self.codec.decode(frames[0])
        if header is None or not 0 <= header.rank < len(self.ranks):
            return None
        if header.world_size != len(self.ranks):
            log.warning(
                "subscriber[%d]: world size %d != %d ranks",
                self.subscriber_id,
                header.world_size,
                len(self.ranks),
            )
            return None
        if not header.payload_frames:
            return ChunkMessage(header, [EncodedPart.inline(p) for p in header.parts])
        if len(frames) != 1 + 2 * len(header.parts):
            self.codec.malformed["frame count"] += 1
            return None
        return ChunkMessage(
            header,
            [
                EncodedPart(p, frames[1 + 2 * i].buffer, frames[2 + 2 * i].buffer)
                for i, p in enumerate(header.parts)
            ],
        )

    def _stage(self, msg: ChunkMessage) -> None:
        state = self.ranks[msg.header.rank]
        state.last_arrival = time.monotonic()
        self.newest_seen = max(self.newest_seen, msg.header.version)
        match msg.header:
            case WeightDiff(version=v, chunk=c) as diff:
                state.track(diff)
                if v > self.version:
                    state.diffs.setdefault(v, {})[c] = msg
                    self._arrived[v] = time.time()
                    if len(self._arrived) > MAX_STAGED_VERSIONS:
                        del self._arrived[min(self._arrived)]
                    while len(state.diffs) > MAX_STAGED_VERSIONS:
                        del state.diffs[min(state.diffs)]
            case WeightAnchor(version=v, chunk=c):
                if c == 0 or any(m.header.version != v for m in state.anchor.values()):
                    state.anchor = {}
                state.anchor[c] = msg

    def _drain(self) -> None:
        for sock in [self.sub, *self.dealers]:
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                msg = self._receive(frames)
                if msg is not None:
                    self._stage(msg)

    def wait(self, timeout_s: float) -> bool:
        """Block until a message is waiting (then ``poll``) or ``timeout_s`` passes."""
        poller = zmq.Poller()
        for sock in [self.sub, *self.dealers]:
            poller.register(sock, zmq.POLLIN)
        return bool(poller.poll(int(timeout_s * 1000)))

    def request_anchor(self, rank: int) -> None:
        state = self.ranks[rank]
        now = time.monotonic()
        asked = state.anchor_requested_at
        if asked is not None and now - asked < ANCHOR_RETRY_S:
            return  # one request in flight is enough
        state.anchor_requested_at = now
        state.anchor = {}
        self.anchors_requested += 1
        self.dealers[rank].send(self.codec.encode(AnchorRequest(self.subscriber_id)))
        log.info("subscriber[%d]: requested anchor from rank %d", self.subscriber_id, rank)

    def _needs_anchor(self, state: RankStream, reach: set[int]) -> bool:
        anchor = state.complete_anchor()
        if anchor is not None:
            version = anchor[0].header.version
            if version > self.version or (state.repair and version == self.version):
                return False  # waiting for the other ranks to reach it
            state.anchor, state.anchor_requested_at = {}, None  # stale: we are past it
        elif state.anchor and time.monotonic() - state.last_arrival < ANCHOR_RETRY_S:
            return False  # an anchor is arriving
        if state.repair or state.lost > self.version:
            return True
        newest = max(state.diffs, default=self.version)
        if newest > max(reach):
            if state._complete(state.diffs[newest]) is not None:
                return True  # a complete diff that does not chain onto our rows
            return time.monotonic() - state.last_arrival > self.anchor_timeout_s
        return False

    # ------------------------------------------------------------------ applying

    def poll(self, learner_version: int | None = None, up_to: int | None = None) -> list[str]:
        """Receive what arrived and move to the newest version every rank can reach (no
        further than ``up_to``, if given and reachable: an evaluation waiting for those exact
        weights; a version past it only when nothing up to it can be reached).
        Returns the names of tensors that changed (empty if the version did not move)."""
        self.last_records = []
        self._drain()
        if self.write_ahead:
            self._write_ahead(up_to)
        paths = [state.paths(self.version) for state in self.ranks]
        for rank, state in enumerate(self.ranks):
            if self._needs_anchor(state, set(paths[rank])):
                self.request_anchor(rank)
        common = set.intersection(*(set(p) for p in paths)) if paths else set()
        if up_to is not None:
            held = {v for v in common if v <= max(up_to, self.version)}
            if self.version >= up_to:  # held back on purpose: not a stall to repair
                self.last_progress = time.monotonic()
                common = held
            elif len(held) > 1:
                common = held  # a step towards up_to
            # Else nothing at or below up_to is reachable from here (diffs missed, an anchor
            # past it, coalesced versions): whatever is reachable goes.
        if common:
            target = max(common)
            plans = [p[target] for p in paths]
            # A repair anchor at the version we hold moves nothing but rewrites its rows.
            if target > self.version or any(used_anchor for _, used_anchor in plans):
                return self._apply(target, plans)
        self._maybe_catch_up(learner_version, paths)
        return []

    def _apply(self, target: int, plans: list[tuple[Steps, bool]]) -> list[str]:
        """Apply every rank's steps in place, each block verified against its checksum as it is
        written; on any failure the undo log puts every block back, so the image is either all
        at ``target`` or untouched."""
        start, started_at = time.perf_counter(), time.time()
        undo_log: list[tuple[np.ndarray, Undo]] = []
        # A rank's diff written ahead is its first step's first parts, or else undone.
        written, taken, ahead_s = self._take_ahead(plans, undo_log)
        self.took_ahead = all(taken) and all(len(steps) == 1 for steps, _ in plans)
        changed: set[str] = set()
        checks: list[tuple[int, int, list[str]]] = []  # (rank, version, tensors that differ)
        wrong: set[int] = set()
        verify_s = 0.0
        for rank, (steps, _) in enumerate(plans):
            try:
                for k, step in enumerate(steps):
                    self._apply_parts(step.parts[written[rank] if k == 0 else 0 :], undo_log)
                    changed.update(part.header.name for part in step.parts)
                    # Once found wrong, a rank's rows are not checked again in this poll
                    # (the same divergence, counted once).
                    if step.check is not None and rank not in wrong:
                        verify_start = time.perf_counter()
                        differ = self._image_differs(step.check)
                        verify_s += time.perf_counter() - verify_start
                        checks.append((rank, step.version, differ))
                        if differ:
                            wrong.add(rank)
            except (ValueError, KeyError) as exc:
                for block, record in reversed(undo_log):
                    undo(block, record)
                self._reject(rank, exc)
                return []
        now = time.time()
        self.last_apply_s = time.perf_counter() - start
        self.last_ahead_s = ahead_s
        if target > self.version:
            published_at = self._published_at(target, now)
            self.last_latency_s = now - published_at
            self.history.append((target, now, self.last_apply_s, self.last_latency_s))
            self.verified_versions.append(target)
            arrived = min(self._arrived.get(target, started_at), started_at)
            self.last_stages = WeightStages(
                version=target,
                arrive_s=max(0.0, arrived - published_at),
                queue_s=started_at - arrived,
                apply_s=self.last_apply_s,
            )
        self._arrived = {v: t for v, t in self._arrived.items() if v > target}
        self.last_records = [record for _, record in undo_log]
        for state, (_, used_anchor) in zip(self.ranks, plans, strict=True):
            if used_anchor:
                self.anchors_applied += 1
                state.anchor, state.anchor_requested_at, state.repair = {}, None, False
            state.diffs = {v: c for v, c in state.diffs.items() if v > target}
        self.version = target
        self.last_progress = time.monotonic()
        if checks:
            self.last_verify_s = verify_s
        for rank, version, differ in checks:
            if not differ:
                self.images_verified += 1
                continue
            self.image_mismatches += 1
            log.warning(
                "subscriber[%d]: rank %d's shard at v%d does not match the learner's (%s); "
                "repairing by anchor",
                self.subscriber_id,
                rank,
                version,
                ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else ""),
            )
            state = self.ranks[rank]
            state.repair, state.anchor, state.anchor_requested_at = True, {}, None
            self.request_anchor(rank)
        return sorted(changed)

    def _reject(self, rank: int, exc: Exception) -> None:
        """A rank's diff failed (malformed, checksum mismatch): drop what it sent, anchor it."""
        self.checksum_failures += 1
        log.warning("subscriber[%d]: rank %d rejected: %s", self.subscriber_id, rank, exc)
        state = self.ranks[rank]
        state.diffs, state.anchor, state.anchor_requested_at = {}, {}, None
        self.request_anchor(rank)

    def _write_ahead(self, up_to: int | None) -> None:
        """Write each rank's chunks of its diff from the version held into the image as they
        arrive, in chunk order (module doc), so that when the version is whole only its last
        chunk is left to write. The version does not move here: ``_apply`` takes a rank's
        written-ahead diff whole or undoes it. Nothing past ``up_to`` is written."""
        limit = None if up_to is None else max(up_to, self.version)
        for rank, state in enumerate(self.ranks):
            ahead = state.ahead
            if ahead is not None and ahead.version not in state.diffs:
                self._undo_ahead(state)  # its messages are gone (trimmed, or the rank reset)
                ahead = None
            if ahead is None:
                starts = [
                    v
                    for v, chunks in state.diffs.items()
                    if (limit is None or v <= limit)
                    and chunks[min(chunks)].header.base_version == self.version
                ]
                if state.repair or self.version < 0 or not starts:
                    continue
                ahead = state.ahead = AheadWrite(min(starts))
            chunks = state.diffs[ahead.version]
            start = time.perf_counter()
            try:
                while ahead.chunks in chunks:
                    msg = chunks[ahead.chunks]
                    if msg.header.base_version != self.version:
                        raise ValueError(f"v{ahead.version} chunk {ahead.chunks}: another base")
                    self._apply_parts(msg.parts, ahead.undo)
                    ahead.chunks += 1
                    ahead.parts += len(msg.parts)
                    ahead.whole = msg.header.num_chunks == ahead.chunks
                    for part in msg.parts:
                        if not ahead.names or ahead.names[-1] != part.header.name:
                            ahead.names.append(part.header.name)
            except (ValueError, KeyError) as exc:
                self._undo_ahead(state)
                self._reject(rank, exc)
            finally:
                ahead.seconds += time.perf_counter() - start

    def ahead_final(self) -> tuple[int, set[str], set[str]] | None:
        """While every rank writes ahead the same version: it, the image's tensors no part of
        it can change any more (finished in every rank's stream, or of no rows there; all of
        them once a rank's diff is whole), and those it changed so far. None otherwise.

        Example: two ranks writing v5, rank 0 through q, k, v of layer 3 and rank 1 through
        q: q is finished in both (final), k and v are not (rank 1 may still send them)."""
        aheads = [state.ahead for state in self.ranks]
        if any(a is None for a in aheads) or len({a.version for a in aheads}) != 1:
            return None
        world, final = len(self.ranks), set(self.image)
        for rank, ahead in enumerate(aheads):
            if ahead.whole:
                continue
            done = set(ahead.names[:-1])
            for name in final:
                tensor = self.image[name]
                start, stop = shard_rows(tensor.shape[0] if tensor.dim() else 1, rank, world)
                if start == stop:
                    done.add(name)  # this rank holds none of its rows: it sends none
            final &= done
        changed = {name for ahead in aheads for name in ahead.names}
        return aheads[0].version, final, changed

    def ahead_records(self) -> list[Undo]:
        """The undo records of every rank's chunks written ahead so far (``ahead_final``'s
        version), oldest first."""
        return [record for s in self.ranks if s.ahead is not None for _, record in s.ahead.undo]

    def _take_ahead(
        self, plans: list[tuple[Steps, bool]], undo_log: list[tuple[np.ndarray, Undo]]
    ) -> tuple[list[int], list[bool], float]:
        """Per rank, how many of its first step's parts are already written (their undo
        records moved to ``undo_log``) and whether it had a diff written ahead that its plan
        starts with; one that the plan does not start with (an anchor instead, a version not
        taken) is undone. Seconds written ahead."""
        written, taken, seconds = [], [], 0.0
        for state, (steps, used_anchor) in zip(self.ranks, plans, strict=True):
            ahead = state.ahead
            starts_with = ahead is not None and steps and steps[0].version == ahead.version
            if starts_with and not used_anchor:
                undo_log.extend(ahead.undo)
                written.append(ahead.parts)
                taken.append(True)
                seconds += ahead.seconds
                state.ahead = None
            else:
                self._undo_ahead(state)
                written.append(0)
                taken.append(False)
        return written, taken, seconds

    @staticmethod
    def _undo_ahead(state: RankStream) -> None:
        if state.ahead is not None:
            for block, record in reversed(state.ahead.undo):
                undo(block, record)
            state.ahead = None

    def _apply_parts(
        self, parts: list[EncodedPart], undo_log: list[tuple[np.ndarray, Undo]]
    ) -> None:
        """Apply one version step's parts (on ``pool``'s threads where given and the parts'
        rows are disjoint, as a publisher's are; overlapping rows, which only a malformed
        message has, go one after another), appending each applied block's undo record;
        raises the first failure once every part has finished."""
        blocks = [self._block(part) for part in parts]  # refused before anything is written
        if self.pool is None or len(parts) < 2 or _overlapping(parts):
            for part, block in zip(parts, blocks, strict=True):
                undo_log.append((block, apply_in_place(part, block)))
            return
        pool = self.pool
        futures = [pool.submit(apply_in_place, p, b) for p, b in zip(parts, blocks, strict=True)]
        failure: Exception | None = None
        for block, future in zip(blocks, futures, strict=True):
            try:
                undo_log.append((block, future.result()))
            except (ValueError, KeyError) as exc:  # the block was left as it was
                failure = failure or exc
        if failure is not None:
            raise failure

    def _image_differs(self, check: ImageChecksum) -> list[str]:
        """The tensors whose rows in our image differ from the learner rank's (by their XXH3-64
        digests); empty when the whole-shard checksum matches. Hashes every byte again."""
        pieces = []
        for name, offset, rows in zip(check.names, check.row_offsets, check.rows, strict=True):
            full = self.image.get(name)
            if full is None or offset < 0 or offset + rows > full.shape[0]:
                return [name]
            pieces.append(as_i16(full[offset : offset + rows]))
        digests = image_digests(pieces)
        if image_checksum(digests) == check.checksum:
            return []
        theirs = np.frombuffer(check.digests, dtype="<u8")
        if theirs.size != digests.size:
            return list(check.names)
        return [check.names[i] for i in np.flatnonzero(digests != theirs)] or ["digests"]

    def _published_at(self, target: int, now: float) -> float:
        """When the learner published ``target`` (its earliest rank), from the diffs we hold
        (``now`` when every rank reached it by anchor: no publish time to measure from)."""
        times = [
            m.header.published_at
            for state in self.ranks
            for m in state.diffs.get(target, {}).values()
        ]
        return min(times, default=now)

    def _block(self, part: EncodedPart) -> np.ndarray:
        """The rows ``part`` covers, as a writable flat int16 view into the image."""
        head = part.header
        full = self.image[head.name]
        if tuple(full.shape) != tuple(head.full_shape):
            raise ValueError(f"{head.name}: shape {tuple(head.full_shape)} != {tuple(full.shape)}")
        if head.row_offset < 0 or head.row_offset + head.rows > full.shape[0]:
            raise ValueError(f"{head.name}: rows {head.row_offset}+{head.rows} out of range")
        return as_i16(full[head.row_offset : head.row_offset + head.rows])

    def _maybe_catch_up(self, learner_version: int | None, paths: list[dict]) -> None:
        """A newer version exists but nothing moves (e.g. a rank's last diffs were all dropped):
        after ``anchor_timeout_s``, anchor every rank that cannot reach it."""
        known = max(learner_version or 0, self.newest_seen)
        now = time.monotonic()
        if known <= self.version:
            self.last_progress = now
            return
        if now - self.last_progress > self.anchor_timeout_s:
            for rank, reach in enumerate(paths):
                if max(reach) < known:
                    self.request_anchor(rank)
            self.last_progress = now

    def close(self) -> None:
        """Stop receiving; the image is left whole at the version held (a diff written ahead
        is undone: a restarted learner group's subscriber takes the image over)."""
        for state in self.ranks:
            self._undo_ahead(state)
        self.sub.close()
        for dealer in self.dealers:
            dealer.close()
