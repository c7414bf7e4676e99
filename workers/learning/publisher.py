"""Learner side of weight streaming (docs/design.md §4).

Each learner rank publishes its own FSDP2 shard; nothing is gathered through rank 0.

    learner thread              pool threads          encoder thread          anchor thread
    ──────────────              ────────────          ──────────────          ─────────────
    optimizer.step()
    publish(v): take_image ───► each block: masters
      (waits for the blocks;      -> bf16 image(v),
       the masters may change     diff vs image(v-1) ─► send each block's part
       once they are read)                              as it is done, on PUB
    returns; next step                                  (never blocks: PUB drops
                                                        at its HWM);
                                                        image := image(v) ───► answers
                                                                               AnchorRequests on
                                                                               ROUTER with
                                                                               image@version

``publish`` takes the version's bf16 image and its diff against the image taken before in one
pass over the masters (``shard_image.take_image``), on the pool's threads, and returns once
every block has been read (SmolLM2-135M: ~0.08 s on two threads); the encoder thread packs the
parts into chunks and sends each as soon as its blocks are done. If the learner publishes
again before the encoder has sent the previous version, the pending version is replaced by the
newer one (coalescing): its diff is then encoded again from the last *sent* version straight
to the newest, ``WeightDiff(version=7, base_version=5)``, and subscribers follow the
``base_version`` chain. The learner never waits for the network.

Wire format: one ZeroMQ multipart message per chunk: a msgpack ``WeightDiff``/``WeightAnchor``
header (``payload_frames=True``, parts with empty ``values``/``indices``), then two frames per
part (values, indices) sent with ``copy=False`` straight from the numpy buffers. A chunk holds
whole blocks covering up to ``chunk_bytes`` of the image; ``row_blocks`` cuts large shards so
that every block fits. A diff's chunks leave as they are encoded (``stream_chunks``), so its
``num_chunks`` is 0 on every chunk but the last, which carries the count. Every rank sends at
least one (possibly empty) message per version, so that subscribers know its rows reached that
version.

Memory cost (host RAM, bf16 = 2 bytes x parameters of this rank's shard = S):
steady state S (the published image, which anchors are served from, and the next diff's
base); plus S for the image being taken and sent; plus S for one pending image if the learner
outruns the encoder (never more: newer ones replace it). Encoded diffs add at most S while
being sent.

Whole-image verification: every ``weights.verify_every`` versions, and when the learner asks
(``publish(v, verify=True)``: a checkpoint is saved at ``v``), the last chunk of the version's
diff carries an ``ImageChecksum`` of this rank's whole shard at ``v``; subscribers compare it
with their copy. A verified version coalesced away passes the request on to the newer one.

Invariant: a diff sent is always against the image last *sent*, and that image is what
anchors serve. Example: after the encoder has sent version 5, an anchor request is answered with
version 5 and the next diff is ``WeightDiff(version=6, base_version=5)``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import msgspec
import torch
import zmq

from streamrl.config import WeightsConfig
from streamrl.cores import burst_pool, side_thread
from streamrl.protocol import AnchorRequest, WeightAnchor, WeightDiff
from streamrl.transport import Codec, bind_random, make_socket
from streamrl.workers.diff_kernels import compile_kernels
from streamrl.workers.learning.shard_image import (
    LocalShard,
    encode_shard,
    encoded_blocks,
    local_bf16_shards,
    shard_image_checksum,
    take_image,
)
from streamrl.workers.weight_codec import EncodedPart

log = logging.getLogger(__name__)


def stream_chunks(
    parts: Iterable[EncodedPart], chunk_bytes: int
) -> Iterator[tuple[list[EncodedPart], bool]]:
    """Greedy packing of whole parts, in order, into chunks covering at most ``chunk_bytes``
    of the image's rows each (``EncodedPart.image_bytes``; one part covering more gets a
    chunk of its own), yielded as ``(chunk, last)`` as soon as the next part shows it full.
    Always at least one, possibly empty, chunk.

    Why the image's bytes and not the payload's: a sparse diff of SmolLM2-135M carries 8 MB
    for a 270 MB image, one 16 MB chunk by payload, so a subscriber could start on nothing
    until the whole version was encoded; by the rows covered it is ~17 chunks, and each is
    written into the subscriber's image while the publisher encodes the next."""
    chunk: list[EncodedPart] = []
    size = 0
    for part in parts:
        if chunk and size + part.image_bytes > chunk_bytes:
            yield chunk, False
            chunk, size = [], 0
        chunk.append(part)
        size += part.image_bytes
    yield chunk, True


def chunk_parts(parts: list[EncodedPart], chunk_bytes: int) -> list[list[EncodedPart]]:
    """``stream_chunks`` as a list (an anchor, encoded whole before it is sent)."""
    return [chunk for chunk, _last in stream_chunks(parts, chunk_bytes)]


def message_frames(encoder: msgspec.msgpack.Encoder, header, chunk: list[EncodedPart]) -> list:
    """``header`` (a WeightDiff/WeightAnchor whose ``parts`` are the chunk's headers) followed
    by the payload frames, in part order."""
    frames: list = [encoder.encode(header)]
    for part in chunk:
        frames += [part.values, part.indices]
    return frames


@dataclass
class _Snapshot:
    version: int
    image: dict[str, LocalShard]  # complete once every one of ``parts`` is done
    taken_at: float  # wall clock, when publish() was called: the start of publish-to-applied
    verify: bool = False  # send the whole shard's ImageChecksum with this version
    # Its blocks' parts against the image taken before it (``base_version``), in order; sent
    # as they are when that is the image last sent, else encoded again against that one.
    parts: list[Future[EncodedPart | None]] = field(default_factory=list)
    base_version: int = -1

    def wait(self) -> None:
        """Until the image is complete; raises what a block's pass raised."""
        for part in self.parts:
            part.result()


class WeightPublisher:
    def __init__(
        self,
        model: torch.nn.Module,
        rank: int,
        world_size: int,
        config: WeightsConfig,
        ctx: zmq.Context | None = None,
        host: str = "127.0.0.1",
        *,
        version: int = 0,
        shard_rank: int | None = None,
        ports: tuple[int, int] = (0, 0),
        encoder_cores: list[int] | None = None,
    ) -> None:
        """``ports``: (PUB, anchors) to bind, 0 = any free one; a restarted learner rank
        binds its predecessor's, so generators' sockets reconnect to it by themselves.
        ``encoder_cores``: the cores the encoder thread may use (default: the process's)."""
        self.encoder_cores = encoder_cores
        # The encoder fans a version's blocks out over the cores it may use (streamrl.cores).
        self._pool = burst_pool(encoder_cores, f"encode[{rank}]")
        compile_kernels(apply=False)  # a learner encodes; its subscribers apply
        self.model, self.rank, self.world_size, self.config = model, rank, world_size, config
        self.shard_rank = shard_rank
        self.ctx = ctx or zmq.Context.instance()
        self.pub = make_socket(self.ctx, zmq.PUB, sndhwm=config.pub_hwm)
        self.pub_endpoint = bind_random(self.pub, host, f"publisher[{rank}] PUB", ports[0])
        # An anchor request is a few dozen bytes; libzmq drops a peer that sends over this.
        self.router = make_socket(self.ctx, zmq.ROUTER, maxmsgsize=1 << 16)
        self.anchor_endpoint = bind_random(
            self.router, host, f"publisher[{rank}] anchors", ports[1]
        )
        # One codec per socket: the anchor thread owns the ROUTER's, the encoder the PUB's.
        self._codec = Codec(AnchorRequest, f"publisher[{rank}] anchors")
        self._pub_encoder = msgspec.msgpack.Encoder()
        self._lock = threading.Condition()
        self.version = version  # last version sent (the image anchors serve)
        self.image = local_bf16_shards(model, shard_rank)
        self.last_snapshot = self.image  # the newest ``publish`` took (never written after)
        self._taken_version = version  # last_snapshot's version: the next diff's base
        self._pending: _Snapshot | None = None
        self._busy = False
        self.anchors_served = 0
        self.coalesced = 0
        self.images_checksummed = 0
        self.last_metrics: dict[str, float] = {}
        # Test hook: (version, chunk index, frames) -> the frames to send, or None to drop the
        # chunk as the PUB high-water mark would (never mutate a frame: dense payloads are
        # views of the image).
        self.send_filter: Callable[[int, int, list], list | None] | None = None
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._encode_loop, name=f"publisher[{rank}]", daemon=True),
            threading.Thread(target=self._serve_anchors, name=f"anchors[{rank}]", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ learner thread

    def publish(self, version: int, verify: bool = False) -> dict[str, float]:
        """Snapshot the shard as ``version`` and hand it to the encoder thread; returns at once.
        ``verify``: send the whole shard's checksum with this version even off the
        ``weights.verify_every`` cadence (a checkpoint is saved at it).
        The metrics returned are those of the last version the encoder finished
        (``weights/version`` says which) plus this call's snapshot time."""
        start, now = time.perf_counter(), time.time()
        every = self.config.verify_every
        verify = verify or (every > 0 and version % every == 0)
        # The image and its diff against the one taken before, in one pass over the masters
        # (shard_image.take_image) on the pool's threads; the encoder sends each block's part
        # as it is done, while the rest are still being taken.
        image, parts = take_image(
            self.model,
            self.last_snapshot,
            chunk_bytes=self.config.chunk_bytes,
            dense_threshold=self.config.dense_threshold,
            shard_rank=self.shard_rank,
            pool=self._pool,
        )
        snapshot = _Snapshot(version, image, now, verify, parts, self._taken_version)
        with self._lock:
            if self._pending is not None:
                self.coalesced += 1  # the encoder is behind: skip straight to the newest
                snapshot.verify |= self._pending.verify  # verify the newer version instead
            self._pending = snapshot
            self._lock.notify_all()
            metrics = dict(self.last_metrics)
        # The masters may change once every block has read them; a block that failed leaves
        # the image incomplete, so this version is raised here (the encoder drops it too).
        snapshot.wait()
        self.last_snapshot, self._taken_version = image, version
        metrics["weights/snapshot_s"] = time.perf_counter() - start
        return metrics

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every published snapshot has been sent (tests, shutdown)."""
        with self._lock:
            return self._lock.wait_for(
                lambda: self._pending is None and not self._busy, timeout=timeout_s
            )

    # ------------------------------------------------------------------ encoder thread

    def _encode_loop(self) -> None:
        side_thread()  # ahead of the learner's step on a core both want (streamrl.cores)
        if self.encoder_cores:
            # This thread only (Linux affinity is per thread): on a rank pinned to one core,
            # encoding a version (0.3-0.8 s for SmolLM2) would otherwise delay the next step
            # by as much; on the run's other cores it overlaps it.
            os.sched_setaffinity(0, self.encoder_cores)
            log.info("publisher[%d]: encoder thread on cores %s", self.rank, self.encoder_cores)
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending is not None or self._stop.is_set())
                if self._pending is None:
                    return
                snapshot, self._pending, self._busy = self._pending, None, True
            try:
                self._send_version(snapshot)
            except Exception:  # keep serving anchors; subscribers re-anchor past the gap
                log.exception("publisher[%d]: failed to publish v%d", self.rank, snapshot.version)
            finally:
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()

    def _send_version(self, snapshot: _Snapshot) -> None:
        """Encode and send ``snapshot`` against the image last sent, each chunk as soon as
        its parts are encoded (``stream_chunks``): subscribers write the first chunks while
        the rest are encoded. ``num_chunks`` is known, and sent, on the last chunk only."""
        start = time.perf_counter()
        # Its parts hold when their base is the version last sent. A coalesced version's base
        # is the one it replaced, never sent (versions only grow), so it never passes this.
        if snapshot.base_version == self.version:
            parts = (p for f in snapshot.parts if (p := f.result()) is not None)
        else:  # its base was never sent (coalesced, or a failed send): against what was
            snapshot.wait()
            parts = encoded_blocks(
                snapshot.image,
                self.image,
                chunk_bytes=self.config.chunk_bytes,
                dense_threshold=self.config.dense_threshold,
                pool=self._pool,
            )
        check, verify_s, send_s = None, 0.0, 0.0
        sent = changed = 0
        for i, (chunk, last) in enumerate(stream_chunks(parts, self.config.chunk_bytes)):
            send_start = time.perf_counter()
            if last and snapshot.verify:
                check = shard_image_checksum(snapshot.image)
                verify_s = time.perf_counter() - send_start
                self.images_checksummed += 1
            header = WeightDiff(
                version=snapshot.version,
                base_version=self.version,
                rank=self.rank,
                world_size=self.world_size,
                parts=[p.header for p in chunk],
                published_at=snapshot.taken_at,
                chunk=i,
                num_chunks=i + 1 if last else 0,
                payload_frames=True,
                image_checksum=check,
            )
            changed += sum(p.header.num_changed for p in chunk)
            frames = message_frames(self._pub_encoder, header, chunk)
            if self.send_filter is not None:
                frames = self.send_filter(snapshot.version, i, frames)
            if frames is not None:
                # PUB never blocks: at the HWM libzmq drops the whole message for that
                # subscriber.
                self.pub.send_multipart(frames, copy=False)
                sent += sum(memoryview(f).nbytes for f in frames)
            send_s += time.perf_counter() - send_start
        # Publish -> the last chunk handed to the socket, hand-off to this thread included:
        # what a subscriber's ``arrive`` spends beyond it is the wire and its receiving.
        out_s = time.time() - snapshot.taken_at
        with self._lock:
            self.image, self.version = snapshot.image, snapshot.version
        total = sum(s.bits.size for s in snapshot.image.values())
        self.last_metrics = {
            "weights/version": float(snapshot.version),
            "weights/changed_frac": changed / max(total, 1),
            "weights/bytes_sent": float(sent),
            "weights/bytes_full": float(2 * total),
            # Encoding and sending interleave: encode_s is the rest of the version's time.
            "weights/encode_s": time.perf_counter() - start - send_s,
            "weights/send_s": send_s - verify_s,
            "weights/out_s": out_s,
            "weights/image_checksum_s": verify_s,
            "weights/images_checksummed": float(self.images_checksummed),
            "weights/anchors_served": float(self.anchors_served),
            "weights/coalesced": float(self.coalesced),
        }

    # ------------------------------------------------------------------ anchor thread

    def anchor_messages(self) -> list[list]:
        """A snapshot of this shard at the last sent version, as multipart messages."""
        with self._lock:
            version, image = self.version, self.image
        chunks = chunk_parts(
            encode_shard(image, None, chunk_bytes=self.config.chunk_bytes, dense_threshold=1.0),
            self.config.chunk_bytes,
        )
        now = time.time()
        return [
            message_frames(
                self._codec.encoder,
                WeightAnchor(
                    version=version,
                    rank=self.rank,
                    world_size=self.world_size,
                    parts=[p.header for p in chunk],
                    published_at=now,
                    chunk=i,
                    num_chunks=len(chunks),
                    payload_frames=True,
                ),
                chunk,
            )
            for i, chunk in enumerate(chunks)
        ]

    def _serve_anchors(self) -> None:
        side_thread()
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            routed = self._codec.decode_routed(self.router.recv_multipart())
            if routed is None:
                continue
            identity, _request = routed
            for message in self.anchor_messages():
                self.router.send_multipart([identity, *message], copy=False)
            self.anchors_served += 1

    def close(self, flush_timeout_s: float = 30.0) -> None:
        """Send what is pending (the final version must reach the generators), then stop."""
        self.flush(flush_timeout_s)
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self.pub.close()
        self.router.close()
