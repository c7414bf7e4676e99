"""Learner side of weight streaming (DESIGN.md §4).

Each learner rank publishes its own FSDP2 shard; nothing is gathered through rank 0. After
optimizer step ``v`` the rank takes the bf16 image of its shard, diffs it bitwise against the
image of ``v-1`` and sends the changed elements over PUB in bounded chunks. A background
thread answers anchor requests (a full snapshot of the shard at the latest version) on a
ROUTER socket, for late joiners and for subscribers that lost a diff.

Memory cost: one bf16 copy of this rank's shard (2 bytes x parameters / world size).

Invariant: the image served as an anchor and the base of the next diff are the same tensor
set, swapped under a lock. Example: after ``publish(5)`` an anchor request is answered with
version 5, and the next diff is ``WeightDiff(version=6, base_version=5)``.
"""

from __future__ import annotations

import logging
import threading
import time

import msgspec
import torch
import zmq

from streamrl.config import WeightsConfig
from streamrl.protocol import AnchorRequest, TensorPart, WeightAnchor, WeightDiff
from streamrl.transport import Codec, bind_random, make_socket
from streamrl.workers.weight_codec import bf16_bytes, checksum, encode_part, shard_rows

log = logging.getLogger(__name__)


def local_bf16_shards(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, tuple, int]]:
    """name -> (bf16 copy of this rank's rows, full shape, row offset), for every parameter.
    Works for FSDP2 (DTensor, Shard(0)) and plain modules (the whole tensor, offset 0)."""
    out = {}
    for name, param in model.named_parameters():
        data = param.detach()
        if hasattr(data, "to_local"):
            mesh = data.device_mesh
            local = data.to_local()
            start, _ = shard_rows(data.shape[0], mesh.get_local_rank(), mesh.size())
            out[name] = (local.to(torch.bfloat16).cpu().clone(), tuple(data.shape), start)
        else:
            out[name] = (data.to(torch.bfloat16).cpu().clone(), tuple(data.shape), 0)
    return out


class WeightPublisher:
    def __init__(
        self,
        model: torch.nn.Module,
        rank: int,
        world_size: int,
        config: WeightsConfig,
        ctx: zmq.Context | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.model, self.rank, self.world_size, self.config = model, rank, world_size, config
        self.ctx = ctx or zmq.Context.instance()
        self.pub = make_socket(self.ctx, zmq.PUB, sndhwm=config.pub_hwm)
        self.pub_endpoint = bind_random(self.pub, host, f"publisher[{rank}] PUB")
        self.router = make_socket(self.ctx, zmq.ROUTER)
        self.anchor_endpoint = bind_random(self.router, host, f"publisher[{rank}] anchors")
        # One codec per socket: the anchor thread owns the ROUTER's, publish() owns the PUB's.
        self._codec = Codec(AnchorRequest, f"publisher[{rank}] anchors")
        self._pub_encoder = msgspec.msgpack.Encoder()
        self._lock = threading.Lock()
        self.version = 0
        self.image = local_bf16_shards(model)
        self.anchors_served = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_anchors, daemon=True)
        self._thread.start()

    def publish(self, version: int) -> dict[str, float]:
        """Diff the current shard against the last published image and send it.
        Never blocks: PUB drops at its high-water mark and the subscriber recovers by anchor."""
        start = time.perf_counter()
        new_image = local_bf16_shards(self.model)
        parts, changed, total = [], 0, 0
        for name, (tensor, full_shape, offset) in new_image.items():
            total += tensor.numel()
            part = encode_part(
                name,
                tensor,
                self.image[name][0],
                full_shape=full_shape,
                row_offset=offset,
                dense_threshold=self.config.dense_threshold,
            )
            if part is not None:
                parts.append(part)
                changed += part.num_changed
        encode_s = time.perf_counter() - start
        with self._lock:
            base, self.version, self.image = self.version, version, new_image
        sent = self._send_chunks(parts, version, base)
        return {
            "weights/changed_frac": changed / max(total, 1),
            "weights/bytes_sent": float(sent),
            "weights/bytes_full": float(2 * total),
            "weights/encode_s": encode_s,
            "weights/anchors_served": float(self.anchors_served),
        }

    def _chunks(self, parts: list[TensorPart]) -> list[list[TensorPart]]:
        chunks: list[list[TensorPart]] = [[]]
        size = 0
        for part in parts:
            nbytes = len(part.values) + len(part.indices)
            if chunks[-1] and size + nbytes > self.config.chunk_bytes:
                chunks.append([])
                size = 0
            chunks[-1].append(part)
            size += nbytes
        return chunks

    def _send_chunks(self, parts: list[TensorPart], version: int, base: int) -> int:
        chunks = self._chunks(parts)
        sent, now = 0, time.time()
        for i, chunk in enumerate(chunks):
            msg = WeightDiff(version, base, self.rank, self.world_size, chunk, now, i, len(chunks))
            frame = self._pub_encoder.encode(msg)
            try:
                self.pub.send(frame, zmq.NOBLOCK)
                sent += len(frame)
            except zmq.Again:  # a slow subscriber will notice the gap and ask for an anchor
                log.warning("publisher[%d]: dropped chunk %d of version %d", self.rank, i, version)
        return sent

    def _anchor_frames(self) -> list[bytes]:
        with self._lock:
            version, image = self.version, self.image
        parts = [
            TensorPart(
                name,
                full_shape,
                offset,
                t.shape[0] if t.dim() else 1,
                "dense",
                bf16_bytes(t),
                checksum(t),
                num_changed=t.numel(),
            )
            for name, (t, full_shape, offset) in image.items()
        ]
        chunks = self._chunks(parts)
        now = time.time()
        return [
            self._codec.encode(
                WeightAnchor(version, self.rank, self.world_size, c, now, i, len(chunks))
            )
            for i, c in enumerate(chunks)
        ]

    def _serve_anchors(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 2 or self._codec.decode(frames[1]) is None:
                continue
            for frame in self._anchor_frames():
                self.router.send_multipart([frames[0], frame])
            self.anchors_served += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.pub.close()
        self.router.close()
