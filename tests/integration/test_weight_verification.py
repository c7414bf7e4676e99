"""Whole-image verification (``weights.verify_every``, docs/design.md §4) over real loopback
sockets: a block of a generator's image that diverged silently, and that no diff touches again
(block checksums never see it), is caught at the next verified version, counted, logged and
repaired by an anchor; a checkpoint step (``publish(v, verify=True)``) verifies off the cadence.

The harness is ``test_weight_streaming.FakeRanks`` (two FSDP2 shards in this process), with
steps that change only some tensors: ``embed`` never changes after version 0. The first case
runs again on every architecture of ``streamrl.models.tiny`` (its embedding the tensor that
diverges).
"""

from __future__ import annotations

import logging
import re
import threading
import time

import msgspec
import pytest
import torch
from test_weight_streaming import FakeRanks, assert_bitwise_equal, poll_until

from streamrl.config import WeightsConfig
from streamrl.models.tiny import ARCHITECTURES
from streamrl.protocol import GeneratorReport, WeightDiff
from streamrl.workers.weight_codec import shard_rows

MOVING = ("up", "big", "norm")  # the tensors a step changes; `embed` stays at version 0


def step(ranks: FakeRanks, *, verify: bool = False, flush: bool = True, moving=MOVING) -> None:
    """One learner version that changes only ``moving`` (relative size 1e-2)."""
    for name in moving:
        tensor = ranks.full[name]
        tensor.mul_(1 + 1e-2 * torch.randn(tensor.shape, generator=ranks.generator))
    ranks._copy_rows()
    ranks.version += 1
    for publisher in ranks.publishers:
        publisher.publish(ranks.version, verify=verify)
    if flush:
        ranks.flush()  # no coalescing: every version is sent


def corrupt_embed(sub, rank: int, world: int = 2, name: str = "embed") -> None:
    """Flip the low bit of one element of ``name`` in ``rank``'s rows of the image."""
    start, stop = shard_rows(sub.image[name].shape[0], rank, world)
    bits = sub.image[name].view(torch.int16)
    bits[start + (stop - start) // 2, 7] ^= 1


def mismatch_versions(caplog: pytest.LogCaptureFixture) -> list[tuple[int, int]]:
    """(rank, version) of each image-mismatch warning logged."""
    found = []
    for record in caplog.records:
        match = re.search(r"rank (\d+)'s shard at v(\d+) does not match", record.getMessage())
        if match:
            assert "embed" in record.getMessage()  # names the tensor that diverged
            found.append((int(match[1]), int(match[2])))
    return found


def wait_repaired(sub, anchors: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sub.anchors_applied < anchors:
        assert time.monotonic() < deadline, sub.metrics()
        sub.poll()
        time.sleep(0.005)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_catches_and_repairs_a_silent_divergence(
    arch: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The whole-image checksums of each architecture's real FSDP2 shards (3-D expert
    tensors, fused projections, tied heads) agree where the image does, and catch the one
    element that diverged."""
    from streamrl.models import load_causal_lm, resolve_model

    caplog.set_level(logging.WARNING, logger="streamrl.workers.generation.subscriber")
    model_dir = resolve_model(arch)
    config = WeightsConfig(chunk_bytes=8192, verify_every=2)
    ranks = FakeRanks(2, config, lambda: load_causal_lm(model_dir, "float32"))
    embed = "model.embed_tokens.weight"
    moving = [name for name in ranks.full if name != embed]
    sub = ranks.subscriber(0)
    time.sleep(0.5)
    try:
        step(ranks, moving=moving)
        poll_until([sub], 1)
        corrupt_embed(sub, rank=1, name=embed)
        step(ranks, moving=moving)  # v2: verified
        poll_until([sub], 2)
        assert sub.image_mismatches == 1 and sub.images_verified == 1  # rank 0 was fine
        assert mismatch_versions(caplog) == [(1, 2)]
        wait_repaired(sub, 1)
        assert_bitwise_equal(sub.image, ranks.full)
        step(ranks, moving=moving)
        step(ranks, moving=moving)
        poll_until([sub], 4)
        assert sub.images_verified == 3 and sub.image_mismatches == 1
        assert sub.checksum_failures == 0
        assert_bitwise_equal(sub.image, ranks.full)
    finally:
        ranks.close(sub)


@pytest.mark.slow  # about 1.5 s: 16 versions over real sockets
def test_silent_divergence_is_caught_at_the_next_verified_version_and_repaired(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="streamrl.workers.generation.subscriber")
    ranks = FakeRanks(2, WeightsConfig(chunk_bytes=4096, verify_every=4))
    sub = ranks.subscriber(0)
    time.sleep(0.5)  # let the SUB socket connect before the first diff
    try:
        for _ in range(2):
            step(ranks)
        poll_until([sub], 2)
        corrupt_embed(sub, rank=1)
        step(ranks)  # v3: not a verified version; the diff never touches `embed`
        poll_until([sub], 3)
        assert sub.image_mismatches == sub.images_verified == 0  # not before
        assert sub.checksum_failures == 0  # invisible to the block checksums

        step(ranks)  # v4: both ranks send their whole-shard checksum
        poll_until([sub], 4)
        assert sub.image_mismatches == 1 and sub.images_verified == 1  # rank 0 was fine
        assert mismatch_versions(caplog) == [(1, 4)]
        wait_repaired(sub, 1)  # the learner is idle at v4: an anchor at the version held
        assert sub.version == 4 and sub.anchors_applied == 1
        assert_bitwise_equal(sub.image, ranks.full)

        for _ in range(4):
            step(ranks)
        poll_until([sub], 8)
        assert sub.images_verified == 3 and sub.image_mismatches == 1  # v8 passes on both

        # Verified versions in the middle of one multi-version poll are checked too: the
        # mismatch is seen at v12 although the image moves from v8 to v14 at once.
        corrupt_embed(sub, rank=0)
        for _ in range(6):
            step(ranks)
        poll_until([sub], 14)
        assert mismatch_versions(caplog) == [(1, 4), (0, 12)]
        assert sub.image_mismatches == 2 and sub.images_verified == 4  # rank 1 passed v12
        wait_repaired(sub, 2)
        assert_bitwise_equal(sub.image, ranks.full)
        step(ranks)
        step(ranks)
        poll_until([sub], 16)
        assert sub.images_verified == 6 and sub.image_mismatches == 2
        assert sub.checksum_failures == 0
        assert_bitwise_equal(sub.image, ranks.full)
        metrics = sub.metrics()
        assert metrics["weights/image_mismatches"] == 2 and metrics["weights/images_verified"] == 6
        assert metrics["weights/verify_s"] > 0
    finally:
        ranks.close(sub)


def test_repair_by_an_anchor_newer_than_the_version_held() -> None:
    ranks = FakeRanks(2, WeightsConfig(chunk_bytes=4096, verify_every=2))
    sub = ranks.subscriber(0)
    time.sleep(0.5)
    # Rank 1's v3 is lost (PUB high-water mark): the subscriber can only reach v2, and learns
    # of the mismatch there while the learner is already at v3.
    ranks.publishers[1].send_filter = lambda v, c, frames: None if v == 3 else frames
    try:
        step(ranks)
        poll_until([sub], 1)
        corrupt_embed(sub, rank=1)
        step(ranks)
        step(ranks)
        poll_until([sub], 2)
        assert sub.image_mismatches == 1 and sub.images_verified == 1  # at v2
        wait_repaired(sub, 1)  # rank 1 by an anchor at v3, rank 0 by its v3 diff
        assert sub.version == 3
        assert_bitwise_equal(sub.image, ranks.full)
        step(ranks)
        poll_until([sub], 4)
        assert sub.image_mismatches == 1 and sub.images_verified == 3  # v4 passes on both
        assert sub.checksum_failures == 0 and sub.anchors_applied == 1
    finally:
        ranks.close(sub)


def test_checkpoint_verifies_off_the_cadence() -> None:
    ranks = FakeRanks(2, WeightsConfig(chunk_bytes=4096, verify_every=0))  # cadence off
    sub = ranks.subscriber(0)
    time.sleep(0.5)
    seen: list[tuple[int, bool]] = []

    def watch(version: int, chunk: int, frames: list) -> list:
        header = msgspec.msgpack.decode(frames[0], type=WeightDiff)
        seen.append((version, header.image_checksum is not None))
        return frames

    ranks.publishers[0].send_filter = watch
    try:
        step(ranks)
        step(ranks)
        poll_until([sub], 2)
        corrupt_embed(sub, rank=1)
        step(ranks)
        poll_until([sub], 3)
        assert sub.images_verified == sub.image_mismatches == 0  # verify_every=0: never
        step(ranks, verify=True)  # v4: a checkpoint is saved at this step
        poll_until([sub], 4)
        assert sub.images_verified == 1 and sub.image_mismatches == 1
        wait_repaired(sub, 1)
        assert_bitwise_equal(sub.image, ranks.full)
        step(ranks)
        poll_until([sub], 5)
        assert sub.images_verified == 1 and sub.image_mismatches == 1
        assert [v for v, checked in seen if checked] == [4]  # only on the last chunk of v4
        assert sum(checked for _, checked in seen) == 1
    finally:
        ranks.close(sub)


def test_a_verified_version_coalesced_away_verifies_the_newer_one() -> None:
    ranks = FakeRanks(2, WeightsConfig(verify_every=0))
    sub = ranks.subscriber(0)
    time.sleep(0.5)
    checked: list[int] = []
    sending, published = threading.Event(), threading.Event()

    def held_send(version: int, chunk: int, frames: list) -> list:
        if msgspec.msgpack.decode(frames[0], type=WeightDiff).image_checksum is not None:
            checked.append(version)
        sending.set()
        published.wait(30)  # rank 0's network is stuck on v1 while the learner goes on
        return frames

    ranks.publishers[0].send_filter = held_send
    try:
        step(ranks, flush=False)
        assert sending.wait(30)  # rank 0's encoder holds v1
        for v in range(2, 9):
            step(ranks, verify=v == 3, flush=False)  # a checkpoint at v3
        published.set()
        ranks.flush()
        poll_until([sub], 8)
        assert ranks.publishers[0].coalesced == 6  # v2..v7 were replaced by newer versions
        assert checked == [8]  # v3's verification went on to v8
        assert sub.images_verified == 2 and sub.image_mismatches == 0  # rank 1 at v3, rank 0 v8
        assert_bitwise_equal(sub.image, ranks.full)
    finally:
        ranks.close(sub)


def test_reports_decode_without_the_new_fields() -> None:
    old = msgspec.msgpack.encode(
        {
            "type": "generator_report",
            "generator_id": 0,
            "applied_version": 3,
            "tokens_generated": 0,
            "groups_pushed": 0,
            "checksum_failures": 0,
            "anchors_applied": 0,
            "time": 0.0,
        }
    )
    report = msgspec.msgpack.decode(old, type=GeneratorReport)
    assert report.images_verified == report.image_mismatches == 0
    diff = msgspec.msgpack.encode(
        {
            "type": "weight_diff",
            "version": 1,
            "base_version": 0,
            "rank": 0,
            "world_size": 1,
            "parts": [],
            "published_at": 0.0,
        }
    )
    assert msgspec.msgpack.decode(diff, type=WeightDiff).image_checksum is None
