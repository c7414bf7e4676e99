"""Trajectory arrays as raw bytes: packing, accessors, version ranges and ``check``; old
frames of a group still read; an admission reply's parts round-trip."""

from __future__ import annotations

import struct

import msgspec
import pytest

from streamrl.protocol import (
    MAX_SENDER_NAME,
    AdmissionReply,
    Directives,
    Grant,
    LearnerClockInfo,
    Receipts,
    ReplyParts,
    Trajectory,
    TrajectoryGroup,
    pack_float32,
    pack_int32,
)


def make(versions: list[int], n_prompt: int = 2) -> Trajectory:
    n = len(versions)
    return Trajectory.from_lists(
        list(range(n_prompt)), [7] * n, [-0.5] * n, versions, 1.0, "stop", generator_id=0
    )


def test_arrays_are_little_endian_int32_and_float32() -> None:
    t = Trajectory.from_lists([1, -2], [2**31 - 1], [-0.1], [3], 0.5, "length", 4, "x", 0.7)
    assert t.prompt_ids == struct.pack("<2i", 1, -2)
    assert t.response_ids == struct.pack("<i", 2**31 - 1)
    assert t.behavior_logprobs == struct.pack("<f", -0.1)
    assert t.token_versions == struct.pack("<i", 3)
    assert (t.prompt_list(), t.response_list(), t.version_list()) == ([1, -2], [2**31 - 1], [3])
    assert t.logprob_list() == [struct.unpack("<f", struct.pack("<f", -0.1))[0]]
    assert (t.num_prompt_tokens, t.num_response_tokens) == (2, 1)
    assert (t.response_text, t.temperature, t.generator_id) == ("x", 0.7, 4)
    # On the wire the arrays are msgpack bin: they decode back byte for byte.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(t), type=Trajectory) == t
    with pytest.raises(OverflowError):
        pack_int32([2**31])


@pytest.mark.parametrize(
    "versions, expected",
    [
        ([], (0, 0)),
        ([5], (5, 5)),
        ([3] * 100, (3, 3)),
        ([3, 3, 4, 2, 4], (2, 4)),
        ([-1, 7], (-1, 7)),
    ],
)
def test_version_range(versions: list[int], expected: tuple[int, int]) -> None:
    t = make(versions)
    assert t.version_range() == (t.min_version, t.max_version) == expected


def test_version_range_of_a_repeated_pattern_that_is_not_aligned() -> None:
    # The first version's bytes (00 01 00 00) also occur at an unaligned offset (5).
    t = make([256, 65536, 256, 65536])
    assert t.version_range() == (256, 65536)


def test_group_sizes_and_versions() -> None:
    group = TrajectoryGroup("g", "p", [make([1, 2, 2]), make([3], n_prompt=4)], 0.0, 1.0)
    assert group.num_tokens == (2 + 3) + (4 + 1)
    assert group.version_range() == (group.min_version, group.max_version) == (1, 3)
    assert group.rewards == [1.0, 1.0]
    assert group.nbytes == 4 * (2 + 3 * 3) + 4 * (4 + 3 * 1)
    assert group.check() is None
    assert TrajectoryGroup("e", "p", [], 0.0, 0.0).version_range() == (0, 0)


def test_check_names_what_is_inconsistent() -> None:
    t = make([0, 0, 0])
    assert t.check() is None
    t.behavior_logprobs = pack_float32([-1.0])
    assert t.check() == "3 response tokens, 1 logprobs, 3 versions"
    t = make([0, 0])
    t.token_versions += b"\x00"
    assert t.check() == "token_versions has 9 bytes, not a multiple of 4"
    t.token_versions = pack_int32([0, 0, 0])
    group = TrajectoryGroup("g", "p", [make([1]), t], 0.0, 0.0)
    assert group.check() == "trajectory 1: 2 response tokens, 2 logprobs, 3 versions"


def test_a_group_frame_from_before_the_delivery_identity_still_reads() -> None:
    group = TrajectoryGroup("0123456789ab.0-4", "p", [make([1])], 0.0, 1.0)
    old = msgspec.to_builtins(group, builtin_types=(bytes,))
    del old["sender"], old["seq"]
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=TrajectoryGroup)
    assert decoded == group and (decoded.sender, decoded.seq) == ("", -1)


@pytest.mark.parametrize(
    "field, value", [("sender", "s" * (MAX_SENDER_NAME + 1)), ("seq", -2), ("seq", 10**18)]
)
def test_a_group_identity_out_of_bounds_is_refused(field: str, value: object) -> None:
    frame = {**msgspec.to_builtins(TrajectoryGroup("g", "p", [], 0.0, 0.0)), field: value}
    with pytest.raises(msgspec.ValidationError, match=field):
        msgspec.msgpack.decode(msgspec.msgpack.encode(frame), type=TrajectoryGroup)


REPLY_PARTS = ReplyParts(
    Grant(granted=2, min_version=3, prompt_indices=[8, 9]),
    Directives(
        stop=True, retire=False, eval_version=4, temperature=0.7, prompts_per_call=5, eval_epoch=1
    ),
    LearnerClockInfo(learner_version=6, weights_epoch=1),
    Receipts(delivered={0: 11, 1: -1}, shard_epochs={1: 2}),
)


def test_an_admission_reply_round_trips_its_parts() -> None:
    grant, directives, clock, receipts = REPLY_PARTS
    reply = AdmissionReply(grant=grant, directives=directives, clock=clock, receipts=receipts)
    frame = msgspec.msgpack.encode(reply)
    assert set(msgspec.msgpack.decode(frame)) == {"type", *ReplyParts._fields}
    assert msgspec.msgpack.decode(frame, type=AdmissionReply).parts() == REPLY_PARTS
    # A part left out decodes to its default.
    bare = msgspec.msgpack.encode(AdmissionReply(grant=grant))
    parts = msgspec.msgpack.decode(bare, type=AdmissionReply).parts()
    assert parts == ReplyParts(grant, Directives(), LearnerClockInfo(), Receipts())
