"""Weight streaming end to end over real loopback sockets (docs/design.md §4).

Two harnesses, one reference: every subscriber's image must equal, bit for bit, the bf16 image
of the learner's full weights.

- ``FakeRanks``: ``world`` FSDP2 shards of one model in this process. Each rank's model is
  sharded by the real ``fully_shard`` under a fake process group (nothing is communicated);
  an "optimizer step" changes full fp32 weights and copies each rank's rows into its shard.
  Fast, so it carries the recovery cases: uneven splits and empty ranks, PUB high-water mark
  overflow, late join, lost chunks, a corrupted diff, coalesced versions.
- ``test_every_architecture_streams_bitwise``: ``FakeRanks`` over the real models of
  ``streamrl.models.tiny`` (fused q/k/v and gate/up tensors, q/k norms, tied heads, 3-D
  expert tensors), each sharded by FSDP2 along the blocks ``decoder_blocks`` finds.
- ``test_two_gloo_learners_stream_to_subscribers``: two real gloo ranks training a tiny Llama
  (tied embeddings, odd sizes) with AdamW, publishers on each rank, subscribers in this
  process; rank 0 gathers the full state dict at the end as the reference.
"""

from __future__ import annotations

import queue
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from streamrl.config import WeightsConfig
from streamrl.models import TINY
from streamrl.models.tiny import ARCHITECTURES
from streamrl.protocol import WeightDiff
from streamrl.workers.generation.subscriber import WeightSubscriber
from streamrl.workers.learning.fsdp import shard_for_training
from streamrl.workers.learning.learner import group_listener
from streamrl.workers.learning.publisher import WeightPublisher
from streamrl.workers.weight_codec import shard_rows


def assert_bitwise_equal(image: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]):
    assert image.keys() <= reference.keys()
    for name, tensor in image.items():
        expected = reference[name].to(torch.bfloat16)
        assert torch.equal(tensor.view(torch.int16), expected.view(torch.int16)), name


def poll_until(subs, version: int, timeout_s: float = 20.0, learner_version=None) -> None:
    deadline = time.monotonic() + timeout_s
    while any(s.version < version for s in subs):
        assert time.monotonic() < deadline, [s.version for s in subs]
        for sub in subs:
            sub.poll(learner_version)
        time.sleep(0.005)


def corrupt_first_value(frames: list) -> list:
    """A copy of the chunk with one byte of its first part's values flipped."""
    values = bytearray(memoryview(frames[1]).cast("B"))
    values[0] ^= 0x01
    return [frames[0], bytes(values), *frames[2:]]


# --------------------------------------------------------------------------- in-process ranks


class Uneven(torch.nn.Module):
    """Shapes that split unevenly: on 3 ranks ``single`` leaves ranks 1-2 empty, ``vector``
    splits 2/2/1, ``embed`` 34/34/33; ``big`` is cut into several row blocks."""

    def __init__(self, big_rows: int = 300, big_cols: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Parameter(torch.randn(101, 48))
        self.up = torch.nn.Parameter(torch.randn(97, 48))
        self.norm = torch.nn.Parameter(torch.randn(48))
        self.vector = torch.nn.Parameter(torch.randn(5))
        self.single = torch.nn.Parameter(torch.randn(1, 4))
        self.big = torch.nn.Parameter(torch.randn(big_rows, big_cols))


class FakeRanks:
    def __init__(self, world: int, config: WeightsConfig, factory=None, **model_kwargs) -> None:
        """``factory`` builds the model (default: ``Uneven(**model_kwargs)``)."""
        from torch.testing._internal.distributed.fake_pg import FakeStore

        factory = factory or (lambda: Uneven(**model_kwargs))
        torch.manual_seed(0)
        reference = factory()
        # Start from bf16-exact values so version 0 is the same image on both sides.
        self.full = {
            n: p.detach().to(torch.bfloat16).float() for n, p in reference.named_parameters()
        }
        self.world = world
        self.models = []
        for rank in range(world):
            dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
            try:
                mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
                model = factory()
                self.models.append(shard_for_training(model, mesh, "bfloat16"))
            finally:
                dist.destroy_process_group()
        self._copy_rows()
        self.publishers = [
            WeightPublisher(m, r, world, config, shard_rank=r) for r, m in enumerate(self.models)
        ]
        self.generator = torch.Generator().manual_seed(1)
        self.version = 0

    @property
    def pub_endpoints(self) -> list[str]:
        return [p.pub_endpoint for p in self.publishers]

    @property
    def anchor_endpoints(self) -> list[str]:
        return [p.anchor_endpoint for p in self.publishers]

    def subscriber(self, sid: int, **kwargs) -> WeightSubscriber:
        image = {n: t.to(torch.bfloat16) for n, t in self.initial.items()}
        return WeightSubscriber(image, self.pub_endpoints, self.anchor_endpoints, sid, **kwargs)

    def _copy_rows(self) -> None:
        if not hasattr(self, "initial"):
            self.initial = {n: t.clone() for n, t in self.full.items()}
        with torch.no_grad():
            for rank, model in enumerate(self.models):
                for name, param in model.named_parameters():
                    start, stop = shard_rows(param.shape[0], rank, self.world)
                    param.to_local().copy_(self.full[name][start:stop])

    def step(self, scale: float) -> None:
        """An update of relative size ``scale``; 1e-3 changes ~10% of the bf16 image."""
        for tensor in self.full.values():
            tensor.mul_(1 + scale * torch.randn(tensor.shape, generator=self.generator))
        self._copy_rows()
        self.version += 1
        for publisher in self.publishers:
            publisher.publish(self.version)

    def flush(self) -> None:
        for publisher in self.publishers:
            assert publisher.flush(30)

    def close(self, *subs: WeightSubscriber) -> None:
        for sub in subs:
            sub.close()
        for publisher in self.publishers:
            publisher.close()


def generator_spec(config, model_dir, ranks: FakeRanks):
    """Generator 0's spec, following ``ranks``'s weight stream (no shards, no controller)."""
    from streamrl.role_specs import GeneratorSpec

    return GeneratorSpec(
        log_file="",
        bind_host="127.0.0.1",
        config=config,
        generator_id=0,
        model_dir=str(model_dir),
        shard_endpoints=[],
        publisher_endpoints=ranks.pub_endpoints,
        anchor_endpoints=ranks.anchor_endpoints,
        admission_endpoint="",
        report_endpoint="",
    )


def tiny_engine_on_a_stream(compute_dtype: str = "bfloat16"):
    """The tiny model's HF engine (bf16 unless asked) and two ``FakeRanks`` streaming its fp32
    weights: what ``GeneratorWeights`` tests run on. Returns (model directory, ranks, config,
    engine)."""
    from streamrl.config import load_config
    from streamrl.models import load_causal_lm, resolve_model
    from streamrl.workers.engines import make_engine

    model_dir = resolve_model(TINY)
    ranks = FakeRanks(
        2, WeightsConfig(chunk_bytes=8192), lambda: load_causal_lm(model_dir, "float32")
    )
    config = load_config(None, [])
    engine = make_engine(
        config.generator, model_dir, 0, compute_dtype=compute_dtype, max_model_len=64
    )
    return model_dir, ranks, config, engine


def assert_engine_holds(engine, reference: dict[str, torch.Tensor]) -> None:
    """Every engine parameter, whatever its dtype, is exactly the bf16 image of ``reference``."""
    for name, param in engine.params.items():
        expected = reference[name].to(torch.bfloat16).to(param.dtype)
        assert torch.equal(param.data.view(-1), expected.view(-1)), name


def assert_same_pack(layer) -> None:
    """A packed layer's copies (``PackedLinear``; a merged projection's weight and bias) are
    bitwise those its parameters give now."""
    from streamrl.workers.engines.fast_decode import MergedProjection

    held = (layer.packed, layer.bias) if isinstance(layer, MergedProjection) else (layer.packed,)
    fresh = layer.pack({})
    fresh = fresh if isinstance(fresh, tuple) else (fresh,)
    for a, b in zip(held, fresh, strict=True):
        assert (a is None) == (b is None), layer
        if a is not None:  # oneDNN's blocked layout: compared as the values it holds
            a, b = (t.to_dense() if t.is_mkldnn else t for t in (a, b))
            assert torch.equal(a, b), layer


SCALES = [1e-4, 1e-3, 1e-2, 1.0]  # sparse, sparse/bitmap, mostly dense, everything changes


@pytest.mark.parametrize("pool", [False, True], ids=["one-thread", "burst-pool"])
def test_uneven_shards_and_empty_ranks_stream_bitwise(pool: bool) -> None:
    """Every publisher encodes on a burst pool (this process's cores); subscribers apply on
    the calling thread or on a pool of their own, one of them writing chunks ahead as they
    arrive: the image ends bitwise the learner's."""
    ranks = FakeRanks(3, WeightsConfig(chunk_bytes=4096))
    subs = [
        ranks.subscriber(i, pool=ThreadPoolExecutor(2) if pool else None, write_ahead=i == 1)
        for i in range(2)
    ]
    time.sleep(0.5)  # let the SUB sockets connect before the first diff
    try:
        for v in range(1, 21):
            ranks.step(SCALES[v % len(SCALES)])
            if v % 3 == 0:
                subs[v % 2].poll()
        ranks.flush()
        poll_until(subs, 20)
        for sub in subs:
            assert_bitwise_equal(sub.image, ranks.full)
            assert sub.anchors_applied == sub.checksum_failures == 0
        metrics = ranks.publishers[0].last_metrics
        assert metrics["weights/version"] == 20 and metrics["weights/changed_frac"] > 0
        # Publish -> the last chunk out spans at least the encoding and sending in it.
        spans = metrics["weights/encode_s"] + metrics["weights/send_s"]
        assert metrics["weights/out_s"] >= spans > 0
    finally:
        ranks.close(*subs)


def test_hwm_overflow_and_late_join_recover_by_anchor() -> None:
    # ~8 MB of bf16 per rank per version, every element changing: far past the socket buffers.
    ranks = FakeRanks(2, WeightsConfig(pub_hwm=1), big_rows=4096, big_cols=2048)
    slow = ranks.subscriber(0, rcvhwm=1, anchor_timeout_s=1.0)
    time.sleep(0.5)
    late = None
    try:
        for v in range(1, 11):
            ranks.step(1.0)
            if v == 5:
                ranks.flush()
                late = ranks.subscriber(
                    1, anchor_timeout_s=1.0
                )  # joins at version 5 holding version 0
        ranks.flush()
        # Everything after some version may have been dropped: only the learner's version
        # (which the generator gets from the controller) says that there is more.
        poll_until([slow, late], 10, timeout_s=60, learner_version=10)
        for sub in (slow, late):
            assert_bitwise_equal(sub.image, ranks.full)
            assert sub.anchors_applied >= 1
    finally:
        ranks.close(slow, *([late] if late else []))


@pytest.mark.parametrize("write_ahead", [False, True], ids=["whole", "write-ahead"])
def test_lost_chunks_recover_by_anchor(write_ahead: bool) -> None:
    ranks = FakeRanks(2, WeightsConfig(chunk_bytes=4096))
    # One told the learner's version, one that notices an incomplete diff stalling.
    hint = ranks.subscriber(0, anchor_timeout_s=0.5, write_ahead=write_ahead)
    stall = ranks.subscriber(1, anchor_timeout_s=0.5, write_ahead=write_ahead)
    time.sleep(0.5)
    pub0 = ranks.publishers[0]
    try:
        # A chunk in the middle of version 3: the hole in the sequence is noticed at once.
        pub0.send_filter = lambda v, c, frames: None if (v, c) == (3, 1) else frames
        for _ in range(4):
            ranks.step(1e-2)
            ranks.flush()  # no coalescing: version 3 is sent
        poll_until([hint, stall], 4)
        assert hint.anchors_applied == stall.anchors_applied == 1
        # The last chunk of the last version: nothing follows it.
        pub0.send_filter = lambda v, c, frames: frames if c == 0 else None
        ranks.step(1.0)
        ranks.flush()
        poll_until([hint], 5, learner_version=5)
        poll_until([stall], 5)
        for sub in (hint, stall):
            assert_bitwise_equal(sub.image, ranks.full)
            assert sub.anchors_applied == 2 and sub.checksum_failures == 0
    finally:
        ranks.close(hint, stall)


@pytest.mark.parametrize(
    ("pool", "write_ahead"),
    [(False, False), (True, False), (True, True)],
    ids=["one-thread", "burst-pool", "write-ahead"],
)
def test_corrupted_diff_is_detected_and_repaired(pool: bool, write_ahead: bool) -> None:
    """A corrupted block among a version's others (applied on a pool's threads, the others
    succeeding beside it) is refused, every block put back, and the rank re-anchored."""
    ranks = FakeRanks(2, WeightsConfig(chunk_bytes=4096 if write_ahead else 16 << 20))
    sub = ranks.subscriber(0, pool=ThreadPoolExecutor(2) if pool else None, write_ahead=write_ahead)
    time.sleep(0.5)
    ranks.publishers[1].send_filter = lambda v, c, f: corrupt_first_value(f) if v == 3 else f
    try:
        for _ in range(6):
            ranks.step(1e-3)
            ranks.flush()  # no coalescing: version 3 is sent
        poll_until([sub], 6)
        assert_bitwise_equal(sub.image, ranks.full)
        assert sub.checksum_failures == 1 and sub.anchors_applied == 1
        assert sub.verified_versions[-1] == 6
    finally:
        ranks.close(sub)


class HoldLastChunk:
    """A send filter that keeps each version's last chunk back until ``release``."""

    def __init__(self, publisher: WeightPublisher) -> None:
        self.publisher, self.held = publisher, {}
        publisher.send_filter = self

    def __call__(self, version: int, chunk: int, frames: list) -> list | None:
        if msgspec.msgpack.decode(frames[0], type=WeightDiff).num_chunks:
            self.held[version] = frames
            return None
        return frames

    def release(self, version: int, change=lambda frames: frames) -> None:
        self.publisher.pub.send_multipart(change(self.held.pop(version)), copy=False)


def written_ahead(sub: WeightSubscriber, before: dict[str, torch.Tensor]) -> None:
    """Poll until some of the image differs from ``before`` (chunks written ahead)."""
    deadline = time.monotonic() + 20
    while all(torch.equal(sub.image[n], t) for n, t in before.items()):
        assert time.monotonic() < deadline, "nothing was written ahead"
        sub.poll()
        time.sleep(0.005)


def test_a_version_written_ahead_moves_whole_or_not_at_all() -> None:
    """Writing ahead, a diff's chunks go into the image as they arrive while the version
    stays; its last chunk moves it. A corrupted last chunk puts back every block of that
    rank written ahead (its rows are the version held, bit for bit) and the rank is
    re-anchored; a subscriber closed mid-version leaves the image whole at the version it
    held."""
    ranks = FakeRanks(2, WeightsConfig(chunk_bytes=4096))
    sub = ranks.subscriber(0, write_ahead=True)
    time.sleep(0.5)
    holds = [HoldLastChunk(p) for p in ranks.publishers]
    try:
        for version in (1, 2):
            before = {n: t.clone() for n, t in sub.image.items()}
            ranks.step(1e-2)
            ranks.flush()
            written_ahead(sub, before)
            assert sub.version == version - 1
            if version == 1:  # whole: the version moves
                for hold in holds:
                    hold.release(version)
                poll_until([sub], 1)
                assert_bitwise_equal(sub.image, ranks.full)
                assert sub.metrics()["weights/ahead_s"] > 0
                continue
            holds[0].release(version)
            holds[1].release(version, corrupt_first_value)
            deadline = time.monotonic() + 20
            while sub.checksum_failures == 0:
                assert time.monotonic() < deadline
                sub.poll()
            # Rank 1's blocks written ahead are undone; rank 0's wait, written, for rank 1.
            assert sub.version == 1 and sub.anchors_requested == 1
            for name, tensor in sub.image.items():
                start, stop = shard_rows(tensor.shape[0], 1, 2)
                assert torch.equal(tensor[start:stop], before[name][start:stop]), name
        for publisher in ranks.publishers:
            publisher.send_filter = None
        poll_until([sub], 2)
        assert_bitwise_equal(sub.image, ranks.full)
        assert sub.anchors_applied == 1
        # Closed mid-version: what was written ahead is undone.
        holds = [HoldLastChunk(p) for p in ranks.publishers]
        before = {n: t.clone() for n, t in sub.image.items()}
        ranks.step(1e-2)
        ranks.flush()
        written_ahead(sub, before)
        sub.close()
        assert_bitwise_equal(sub.image, before)
    finally:
        ranks.close()


def test_a_tensor_written_ahead_is_final_once_its_rank_has_moved_past_it() -> None:
    """``ahead_final`` names only tensors that already hold the version's values in every
    rank's rows, and none of those the chunk still to come carries."""
    ranks = FakeRanks(2, WeightsConfig(chunk_bytes=4096))
    sub = ranks.subscriber(0, write_ahead=True)
    time.sleep(0.5)
    holds = [HoldLastChunk(p) for p in ranks.publishers]
    try:
        before = {n: t.clone() for n, t in sub.image.items()}
        ranks.step(1e-2)
        ranks.flush()
        written_ahead(sub, before)
        # Until every rank's chunks have arrived ahead (one rank's may come first), there is
        # nothing to name or nothing yet final in every rank's rows.
        deadline = time.monotonic() + 20
        while not (found := sub.ahead_final()) or not found[1]:
            assert time.monotonic() < deadline, "no tensor became final while written ahead"
            sub.poll()
            time.sleep(0.005)
        version, final, changed = found
        assert version == 1 and final <= changed <= set(sub.image)
        held = {
            part.name
            for hold in holds
            for part in msgspec.msgpack.decode(hold.held[1][0], type=WeightDiff).parts
        }
        assert not final & held
        for name in final:
            assert torch.equal(sub.image[name], ranks.full[name].to(torch.bfloat16)), name
        for hold in holds:
            hold.release(1)
        poll_until([sub], 1)
        assert sub.took_ahead and sub.ahead_final() is None
    finally:
        ranks.close(sub)


@pytest.mark.parametrize("write_ahead", [False, True], ids=["whole", "write-ahead"])
def test_coalesced_versions_follow_the_base_chain(write_ahead: bool) -> None:
    ranks = FakeRanks(2, WeightsConfig(chunk_bytes=4096))
    sub = ranks.subscriber(0, write_ahead=write_ahead)
    time.sleep(0.5)
    bases: list[tuple[int, int]] = []

    def slow_send(version: int, chunk: int, frames: list) -> list:
        header = msgspec.msgpack.decode(frames[0], type=WeightDiff)
        bases.append((header.base_version, header.version))
        time.sleep(0.2)  # the network is slower than the learner
        return frames

    ranks.publishers[0].send_filter = slow_send
    try:
        for _ in range(8):
            ranks.step(1e-3)
        ranks.flush()
        poll_until([sub], 8)
        assert ranks.publishers[0].coalesced > 0
        assert any(v - b > 1 for b, v in bases) and bases[-1][1] == 8
        assert_bitwise_equal(sub.image, ranks.full)
        assert sub.anchors_applied == 0
    finally:
        ranks.close(sub)


@pytest.mark.parametrize("arch", [TINY, *ARCHITECTURES])
def test_every_architecture_streams_bitwise(arch: str) -> None:
    """Each architecture's learner, FSDP2 on two ranks with every decoder block sharded on
    its own, streams its whole image losslessly through sparse, dense and full changes."""
    from torch.distributed.fsdp import FSDPModule

    from streamrl.models import load_causal_lm, resolve_model
    from streamrl.workers.learning.fsdp import decoder_blocks

    model_dir = resolve_model(arch)
    ranks = FakeRanks(
        2, WeightsConfig(chunk_bytes=8192), lambda: load_causal_lm(model_dir, "float32")
    )
    for model in ranks.models:
        blocks = decoder_blocks(model)
        assert len(blocks) == model.config.num_hidden_layers
        assert all(isinstance(b, FSDPModule) for b in blocks)
    sub = ranks.subscriber(0)
    time.sleep(0.5)
    try:
        for scale in SCALES:
            ranks.step(scale)
        ranks.flush()
        poll_until([sub], len(SCALES))
        assert sub.image.keys() == ranks.full.keys()
        assert_bitwise_equal(sub.image, ranks.full)
        assert sub.checksum_failures == 0 and sub.anchors_applied == 0
    finally:
        ranks.close(sub)


# --------------------------------------------------------------------------- two gloo ranks

VERSIONS = 24
LATE_JOIN_AT = 6
# (rank, from version, chunk): the first version sent from then on loses / corrupts that chunk
# (the first version sent: the publisher may coalesce the exact one away).
DROP = (0, 4, 1)
CORRUPT = (1, 9, 0)


def _tiny_llama(model_dir: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=101,  # odd sizes: uneven FSDP2 splits on 2 ranks
        hidden_size=48,
        intermediate_size=97,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)


def _rank_main(rank: int, listener, model_dir: str, out: str, to_test, go, done) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from streamrl.models import load_causal_lm

    torch.set_num_threads(1)
    from streamrl.workers.learning.learner import rendezvous

    # The product's rendezvous: the store and gloo stay on loopback; rank 0 serves on the
    # socket the test bound (``group_listener``).
    master = f"127.0.0.1:{listener.getsockname()[1]}"
    store = rendezvous(master, rank, 2, listener)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    mesh = dist.device_mesh.init_device_mesh("cpu", (2,))
    model = load_causal_lm(Path(model_dir), "float32")
    shard_for_training(model, mesh, "bfloat16")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    publisher = WeightPublisher(model, rank, 2, WeightsConfig(chunk_bytes=8192))
    encodings: Counter[str] = Counter()
    done_actions: set[str] = set()

    def hook(version: int, chunk: int, frames: list) -> list | None:
        for part in msgspec.msgpack.decode(frames[0], type=WeightDiff).parts:
            encodings[part.encoding] += 1
        for (hit_rank, from_version, hit_chunk), action in [(DROP, "drop"), (CORRUPT, "corrupt")]:
            if (rank, chunk) == (hit_rank, hit_chunk) and version >= from_version:
                if action not in done_actions:
                    done_actions.add(action)
                    return None if action == "drop" else corrupt_first_value(frames)
        return frames

    publisher.send_filter = hook
    to_test.put(("endpoints", rank, publisher.pub_endpoint, publisher.anchor_endpoint))
    go.wait()
    gen = torch.Generator().manual_seed(rank)
    for version in range(1, VERSIONS + 1):
        ids = torch.randint(0, 101, (4, 16), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        publisher.publish(version)
        if rank == 0:
            to_test.put(("version", version))
    publisher.flush()
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        torch.save({k: v.to(torch.bfloat16) for k, v in state.items()}, out)
    to_test.put(("finished", rank, dict(encodings)))
    done.wait()
    publisher.close()
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_learners_stream_to_subscribers(tmp_path: Path) -> None:
    from streamrl.models import load_causal_lm

    _tiny_llama(tmp_path / "model")
    initial = dict(load_causal_lm(tmp_path / "model", "bfloat16").named_parameters())

    def fresh_image() -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in initial.items()}

    ctx = mp.get_context("spawn")
    to_test, go, done = ctx.Queue(), ctx.Event(), ctx.Event()
    reference = tmp_path / "reference.pt"
    listener = group_listener("127.0.0.1", 2)
    args = (listener, str(tmp_path / "model"), str(reference), to_test, go, done)
    procs = [ctx.Process(target=_rank_main, args=(r, *args), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    listener.close()  # each rank took a duplicate of it
    subs: list[WeightSubscriber] = []
    try:
        endpoints = {}
        while len(endpoints) < 2:
            _, rank, pub, anchor = to_test.get(timeout=60)
            endpoints[rank] = (pub, anchor)
        pubs, anchors = [endpoints[r][0] for r in range(2)], [endpoints[r][1] for r in range(2)]
        subs = [WeightSubscriber(fresh_image(), pubs, anchors, i) for i in range(2)]
        time.sleep(0.5)
        go.set()
        finished, encodings, learner_version = 0, Counter(), 0
        deadline = time.monotonic() + 90
        while finished < 2 or any(s.version < VERSIONS for s in subs):
            assert time.monotonic() < deadline, [s.version for s in subs]
            try:
                msg = to_test.get_nowait()
            except queue.Empty:
                msg = None
            if msg and msg[0] == "version":
                learner_version = msg[1]
                if learner_version == LATE_JOIN_AT:
                    subs.append(WeightSubscriber(fresh_image(), pubs, anchors, 2))
            elif msg and msg[0] == "finished":
                finished += 1
                encodings.update(msg[2])
            for sub in subs:
                sub.poll(learner_version)
            time.sleep(0.005)
        expected = torch.load(reference)
        for sub in subs:
            assert_bitwise_equal(sub.image, expected)
            assert sub.version == VERSIONS
            # weights.verify_every (10): real FSDP2 shards' whole-image checksums agree.
            assert sub.images_verified >= 1 and sub.image_mismatches == 0
        late = subs[2]
        # Every early subscriber lost rank 0's v4 and rejected rank 1's corrupted v9.
        for sub in subs[:2]:
            assert sub.checksum_failures == 1
            assert sub.anchors_applied >= 2
        assert late.anchors_applied >= 1
        assert len(encodings) >= 2, encodings  # the learner's diffs were not all one encoding
        # Training moved every matrix (norm weights at 1.0 move less than a bf16 step).
        for name, param in initial.items():
            assert param.dim() == 1 or not torch.equal(param, expected[name]), name
    finally:
        done.set()
        for sub in subs:
            sub.close()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("background", [True, False], ids=["weight-thread", "inline"])
def test_the_generator_s_engine_follows_the_stream_while_it_samples(
    background: bool, dtype: str
) -> None:
    """``GeneratorWeights`` on a real HF engine (prepacked where oneDNN runs bf16; fp32 as on
    an AVX2 CPU): versions stream while the engine samples and are adopted between its decode
    steps, on the weight thread (prepared off the decode path, the engine's tensors written
    only by the adoption) or inline. A tensor the engine has whole once then goes by its
    changed elements (its first version whole: the fp32 model the engine loaded is not the
    bf16 image). The engine is bitwise at the learner's image after every version; every
    sequence's token versions only move forward."""
    import zmq

    from streamrl.protocol import GeneratorActivity
    from streamrl.workers.engines.base import SamplingParams
    from streamrl.workers.generation.generator_weights import GeneratorWeights

    model_dir, ranks, config, engine = tiny_engine_on_a_stream(dtype)
    by_positions: list[str] = []  # the tensors handed over by their changed elements
    prepare = engine.prepare_weights

    def spy(named, version, pool=None, positions=None):
        by_positions.extend(positions or {})
        return prepare(named, version, pool=pool, positions=positions)

    engine.prepare_weights = spy
    spec = generator_spec(config, model_dir, ranks)
    timers, adopted = GeneratorActivity(), []
    ctx = zmq.Context()
    weights = GeneratorWeights(
        ctx, engine, spec, timers, lambda: adopted.append(engine.version), background=background
    )
    image = weights.subscriber.image
    # On the weight thread the tensors a forward reads are the image's own copies; inline
    # the image is the engine's parameters. An fp32 engine shares none.
    live = engine.live_weight_names() if background else set()
    for name, param in engine.params.items():
        shared = dtype == "bfloat16" and name not in live
        assert (image[name].data_ptr() == param.data_ptr()) == shared, name
    time.sleep(0.5)  # the SUB sockets connect before the first diff
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    prompts = [[1, 5, 9, 2], [3, 4], [7, 7, 7]]
    try:
        for i, scale in enumerate(SCALES * 2):
            # On the weight thread, the last version's last chunks are held until some of it
            # is prepared ahead: what a version slower to arrive than to poll gives.
            holds = [HoldLastChunk(p) for p in ranks.publishers] if background and i == 7 else []
            before = weights.tensors_prepared_ahead
            ranks.step(scale)
            weights.learner_version = ranks.version
            if holds:
                ranks.flush()
                deadline = time.monotonic() + 30
                while weights.tensors_prepared_ahead <= before:
                    assert time.monotonic() < deadline, "nothing was prepared ahead"
                    time.sleep(0.01)
                for hold in holds:
                    hold.publisher.send_filter = None
                    hold.release(ranks.version)
            deadline = time.monotonic() + 30
            while engine.version < ranks.version:
                assert time.monotonic() < deadline, engine.version
                for out in engine.generate(prompts, params, on_step=weights.poll):
                    assert out.token_versions == sorted(out.token_versions)
            assert_engine_holds(engine, ranks.full)
        assert weights.wait_for_version(ranks.version, time.monotonic() + 30)
        # The fp32 engine's own copy goes by positions once held whole (``spare_copies``:
        # on for fp32, off by default for bf16).
        assert bool(by_positions) == (dtype == "float32")
        assert adopted == sorted(adopted) and adopted[-1] == ranks.version
        # Every packed copy, built with the rest or ahead of it a group at a time, is the
        # one the final weights give.
        for layers in engine._packed.values():
            for layer in layers:
                assert_same_pack(layer)
        if background:
            assert weights.tensors_prepared_ahead > 0
        assert weights.held_epoch == 0 and timers.weights_pause_s > 0
        assert 0 <= weights.last_latency_s < 30
        # The latency split by stage: the version adopted last, each stage measured, and
        # together the whole of publish -> adopted (the same clock on one host).
        stages = weights.last_stages
        assert stages.version == engine.version
        parts = [stages.arrive_s, stages.queue_s, stages.apply_s, stages.prepare_s, stages.adopt_s]
        assert all(p >= 0 for p in parts) and stages.apply_s > 0 and stages.prepare_s > 0
        assert sum(parts) == pytest.approx(weights.last_latency_s, abs=0.02)
    finally:
        weights.close()
        engine.shutdown()
        ranks.close()
        ctx.destroy(linger=0)


def test_the_weight_thread_never_parks_whatever_moment_the_generator_adopts() -> None:
    """The hand-off between the weight thread and the generator's ``poll`` (issue 52 item 2):
    for every version, the weight thread is stopped at the first line it runs after filling the
    hand-off slot, and the generator adopts right then (a second thread calls ``poll``; it gets
    up to 0.5 s before the weight thread goes on). Whatever that moment, the thread prepares the
    next version: the engine reaches the last one. (The old hand-off published the slot under
    one lock and set its ``ready`` flag after: adopted in between, the flag stayed set with
    nothing prepared and the thread parked for ever at one version.)"""
    import sys
    import threading

    import zmq

    from streamrl.protocol import GeneratorActivity
    from streamrl.workers.generation.generator_weights import GeneratorWeights

    model_dir, ranks, config, engine = tiny_engine_on_a_stream()
    spec = generator_spec(config, model_dir, ranks)
    filled, adopted = threading.Event(), threading.Event()

    def in_advance(frame, event, _arg):
        # A line of ``_advance`` on the weight thread: the first one run with the slot full
        # (once per call) waits there while the generator adopts.
        owner = frame.f_locals.get("self")
        if event == "line" and owner is not None and owner._prepared is not None:
            filled.set()
            adopted.wait(0.5)
            adopted.clear()
            return None  # the rest of this call of ``_advance`` runs untraced
        return in_advance

    def tracer(frame, event, _arg):
        if frame.f_code.co_name == "_advance" and threading.current_thread().name.startswith(
            "weights-"
        ):
            return in_advance
        return None

    ctx = zmq.Context()
    threading.settrace(tracer)  # the weight thread starts in the constructor
    try:
        weights = GeneratorWeights(ctx, engine, spec, GeneratorActivity(), lambda: None)
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
    assert weights.background and sys.gettrace() is None
    time.sleep(0.5)  # the SUB sockets connect before the first diff
    try:
        for scale in [1e-4, 1e-3, 1e-4, 1e-2, 1e-3]:
            ranks.step(scale)
            weights.learner_version = ranks.version
            assert filled.wait(30), f"v{ranks.version} never prepared (engine {engine.version})"
            filled.clear()
            poller = threading.Thread(target=weights.poll)
            poller.start()
            poller.join(0.25)
            adopted.set()  # the weight thread goes on (the poll may still wait for it)
            poller.join(10)
            assert not poller.is_alive()
            assert weights.wait_for_version(ranks.version, time.monotonic() + 30), (
                f"the engine stopped at v{engine.version} of {ranks.version}"
            )
        assert_bitwise_equal({n: p.data for n, p in engine.params.items()}, ranks.full)
    finally:
        adopted.set()
        weights.close()
        engine.shutdown()
        ranks.close()
        ctx.destroy(linger=0)


def test_a_published_version_that_never_comes_is_a_stall_and_an_unpublished_one_is_not() -> None:
    """Liveness is progress (issue 52 item 3): a generator waiting for a version the learner
    has published is at work, and a hand-off that never brings it shows as a stall in its
    heartbeats (``workers.progress``); waiting for a version not yet published is idle."""
    import threading

    import zmq

    from streamrl.protocol import GeneratorActivity
    from streamrl.workers.generation.generator_weights import GeneratorWeights

    model_dir, ranks, config, engine = tiny_engine_on_a_stream()
    ctx = zmq.Context()
    weights = GeneratorWeights(
        ctx, engine, generator_spec(config, model_dir, ranks), GeneratorActivity(), lambda: None
    )
    try:
        seen: list[float] = []
        for learner_version in (0, 3):  # v3 not yet published; then said published, never sent
            weights.learner_version = learner_version
            waiter = threading.Thread(
                target=weights.wait_for_version, args=(3, time.monotonic() + 1.5)
            )
            waiter.start()
            time.sleep(1.2)
            seen.append(weights.progress.stalled_s())
            waiter.join()
            assert weights.progress.stalled_s() == 0.0  # the wait ended: no work in hand
        assert seen[0] == 0.0 and seen[1] > 1.0, seen
    finally:
        weights.close()
        engine.shutdown()
        ranks.close()
        ctx.destroy(linger=0)


def test_a_grant_waiting_across_a_learner_restart_samples_on_the_new_epoch() -> None:
    """A grant for v3 of epoch 0 waits while v3 is being published; the learners restart from
    their v2 checkpoint (epoch 1) and could reach v3 again only by training on this
    generator's groups: the wait moves to epoch 1's v2 and ends once its anchors land, instead
    of waiting for v3 for ever (the chaos lane's hang of 2026-12-02)."""
    import zmq

    from streamrl.protocol import GeneratorActivity, LearnerClockInfo
    from streamrl.workers.generation.generator_weights import GeneratorWeights

    model_dir, ranks, config, engine = tiny_engine_on_a_stream()
    ctx = zmq.Context()
    weights = GeneratorWeights(
        ctx, engine, generator_spec(config, model_dir, ranks), GeneratorActivity(), lambda: None
    )
    try:
        for _ in range(2):
            ranks.step(1e-3)
        ranks.flush()
        weights.follow_clock(LearnerClockInfo(learner_version=2))
        assert weights.wait_for_version(2, time.monotonic() + 30)
        weights.follow_clock(LearnerClockInfo(learner_version=3))  # v3 said published, lost
        asked: list[float] = []

        def restarted_learners() -> bool:  # the admission reply, once a second
            asked.append(time.monotonic())
            weights.follow_clock(LearnerClockInfo(learner_version=2, weights_epoch=1))
            return len(asked) < 30

        assert weights.wait_for_grant(3, run_goes_on=restarted_learners)
        assert (weights.held_epoch, engine.version) == (1, 2)
        assert len(asked) < 30  # it ended on the anchors, not on the run stopping
    finally:
        weights.close()
        engine.shutdown()
        ranks.close()
        ctx.destroy(linger=0)


def test_the_evaluation_process_s_engine_takes_only_the_version_it_evaluates() -> None:
    """``GeneratorWeights.up_to`` (the evaluation process): the image follows the stream up to
    the version asked while the engine prepares nothing; at that version the engine takes
    every tensor changed since the version it held, in one update, and ends bitwise at the
    learner's image. ``receive_only`` (generator 0 sampling) moves nothing."""
    import zmq

    from streamrl.protocol import GeneratorActivity
    from streamrl.workers.generation.generator_weights import GeneratorWeights

    model_dir, ranks, config, engine = tiny_engine_on_a_stream()
    spec = generator_spec(config, model_dir, ranks)
    prepared: list[tuple[int, set[str]]] = []
    prepare = engine.prepare_weights

    def recording_prepare(named, version, pool=None, positions=None):
        prepared.append((version, {name for name, _ in named}))
        return prepare(named, version, pool, positions)

    engine.prepare_weights = recording_prepare
    ctx = zmq.Context()
    weights = GeneratorWeights(
        ctx, engine, spec, GeneratorActivity(), lambda: None, background=False
    )
    time.sleep(0.5)  # the SUB sockets connect before the first diff
    try:
        weights.learner_version, weights.up_to = 4, 4
        changed: set[str] = set()
        for scale in [1e-4, 1e-3, 1e-4, 1e-2]:
            before = {n: t.clone() for n, t in ranks.full.items()}
            ranks.step(scale)
            ranks.flush()
            changed |= {n for n, t in ranks.full.items() if not torch.equal(t, before[n])}
            if ranks.version == 3:  # generator 0 samples: the stream waits as received
                for _ in range(20):
                    weights.receive_only()
                    time.sleep(0.01)
                assert weights.subscriber.version == 2
            deadline = time.monotonic() + 30
            while weights.subscriber.version < ranks.version:
                assert time.monotonic() < deadline, weights.subscriber.version
                weights.poll()
                weights.subscriber.wait(0.01)
            assert engine.version == (4 if ranks.version == 4 else 0), prepared
        assert [version for version, _ in prepared] == [4]
        assert prepared[0][1] == changed
        assert_bitwise_equal({n: p.data for n, p in engine.params.items()}, ranks.full)
    finally:
        weights.close()
        engine.shutdown()
        ranks.close()
        ctx.destroy(linger=0)


def test_a_subscriber_holds_at_the_version_asked_unless_it_cannot_reach_it() -> None:
    """``poll(up_to=v)`` (the evaluation process): stops at v while later diffs wait, moves
    on when asked; a subscriber that missed the diffs up to v takes the anchor past it."""
    ranks = FakeRanks(2, WeightsConfig(chunk_bytes=4096))
    sub = ranks.subscriber(0, anchor_timeout_s=0.5)
    time.sleep(0.5)
    late = None
    try:
        for _ in range(5):
            ranks.step(1e-3)
            ranks.flush()  # one diff per version: none coalesced past 2
        deadline = time.monotonic() + 20
        while sub.version < 2:
            assert time.monotonic() < deadline
            sub.poll(5, up_to=2)
            time.sleep(0.01)
        for _ in range(20):
            sub.poll(5, up_to=2)
            time.sleep(0.01)
        assert sub.version == 2 and sub.anchors_requested == 0
        poll_until([sub], 5, learner_version=5)
        assert_bitwise_equal(sub.image, ranks.full)
        late = ranks.subscriber(1, anchor_timeout_s=0.5)  # v1..v5 went before it connected
        deadline = time.monotonic() + 30
        while late.version < 5:
            assert time.monotonic() < deadline
            late.poll(5, up_to=2)
            time.sleep(0.01)
        assert late.anchors_applied >= 1
        assert_bitwise_equal(late.image, ranks.full)
    finally:
        ranks.close(sub, *([late] if late else []))
