"""Well-typed but poisonous groups at a shard's door (``buffers.frames.refusal``): 10,000
seeded groups, each valid msgpack of the right type, most carrying one poison a learner would
die of or train wrongly on (an empty prompt, responses all empty, a NaN or infinite reward or
logprob, a temperature <= 0, a token id outside the vocabulary, no trajectories). Each must be
refused and counted under the reason a local prediction names, acknowledged to its sender
(never resent), and counted as dropped ``invalid`` so its admission budget returns; the
clean ones are accepted, and the shard serves on."""

from __future__ import annotations

import math
import random

import msgspec
import pytest
import zmq
from fuzzgen import Tally, serving
from support import wait_until

from streamrl.buffers.client import BufferClient
from streamrl.buffers.delivery import group_id, shard_sender
from streamrl.buffers.frames import refusal
from streamrl.buffers.server import BufferShard
from streamrl.config import BufferConfig
from streamrl.protocol import Trajectory, TrajectoryGroup, pack_float32, pack_int32

pytestmark = pytest.mark.slow

N_GROUPS = 10_000
VOCAB = 100
SENDER = shard_sender("0123456789ab", 0)
POISONS = (
    "clean",
    "empty_prompt",
    "empty_responses",
    "nan_reward",
    "inf_reward",
    "nan_logprob",
    "inf_logprob",
    "zero_temperature",
    "negative_temperature",
    "nan_temperature",
    "id_over_vocab",
    "negative_id",
    "no_trajectories",
)


def poisoned_group(rng: random.Random, i: int, poison: str) -> TrajectoryGroup:
    def trajectory(reward: float) -> Trajectory:
        n = rng.randrange(1, 6)
        return Trajectory.from_lists(
            [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 5))],
            [rng.randrange(VOCAB) for _ in range(n)],
            [-rng.random() * 5 for _ in range(n)],
            [0] * n,
            reward,
            "stop",
            0,
            temperature=rng.choice([0.7, 1.0]),
        )

    trajectories = [trajectory(r) for r in (0.0, 1.0, rng.random())]
    victim = rng.randrange(len(trajectories))
    t = trajectories[victim]
    match poison:
        case "empty_prompt":
            t.prompt_ids = b""
        case "empty_responses":
            for u in trajectories:
                u.response_ids = u.behavior_logprobs = u.token_versions = b""
        case "nan_reward" | "inf_reward":
            t.reward = math.nan if poison == "nan_reward" else -math.inf
        case "nan_logprob" | "inf_logprob":
            logprobs = t.logprob_list()
            logprobs[-1] = math.nan if poison == "nan_logprob" else math.inf
            t.behavior_logprobs = pack_float32(logprobs)
        case "zero_temperature" | "negative_temperature" | "nan_temperature":
            t.temperature = {"zero": 0.0, "negative": -1.0, "nan": math.nan}[poison.split("_")[0]]
        case "id_over_vocab" | "negative_id":
            ids = t.response_list()
            ids[0] = VOCAB + rng.randrange(10**6) if poison == "id_over_vocab" else -1
            t.response_ids = pack_int32(ids)
        case "no_trajectories":
            trajectories = []
    return TrajectoryGroup(group_id(SENDER, i), f"p{i}", trajectories, 1.0, 2.0)


@pytest.fixture(params=[False, True], ids=["memory", "durable"])
def shard(request, tmp_path):
    config = BufferConfig(capacity=N_GROUPS * 2, max_staleness=2, durable=request.param)
    with serving(BufferShard(config, 0, log_dir=tmp_path, vocab_size=VOCAB)) as shard:
        yield shard


def test_10k_poisonous_groups_are_refused_by_reason_and_counted(shard, ctx):
    tally = Tally(f"poisonous groups ({'durable' if shard.log else 'memory'})")
    rng = random.Random(27_010)
    groups = [poisoned_group(rng, i, rng.choice(POISONS)) for i in range(N_GROUPS)]
    predicted: dict[str, int] = {}
    for g in groups:
        why = refusal(g, VOCAB) or "clean"
        predicted[why] = predicted.get(why, 0) + 1
    # Every poison the corpus plants is caught, under its own reason.
    assert set(predicted) == {
        "clean",
        "empty_prompt",
        "empty_responses",
        "nonfinite_reward",
        "nonfinite_logprob",
        "bad_temperature",
        "token_out_of_vocab",
        "no_trajectories",
    }, predicted
    clean = predicted.pop("clean")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(shard.ingest_endpoint)
    for g in groups:
        push.send(msgspec.msgpack.encode(g))
    tally.inputs += len(groups)
    client = BufferClient([shard.request_endpoint], ctx=ctx, reply_timeout_s=5)
    try:
        wait_until(
            lambda: (s := client.stats()[0]).ingested + sum(s.dropped.values()) == N_GROUPS,
            timeout=120,
        )
        stats = client.stats()[0]
        assert stats.malformed == 0
        assert stats.invalid == predicted
        assert stats.dropped["invalid"] == sum(predicted.values())
        assert stats.ingested == clean
        if shard.log is not None:  # on the log too: received, and removed as invalid
            assert stats.received_total == N_GROUPS
            assert stats.removed_total.get("invalid") == sum(predicted.values())
        # Acknowledged, refused ones too: the sender forgets them and never resends them.
        assert stats.delivered == {SENDER: N_GROUPS - 1}
        # The shard serves on: every clean group comes out, whole.
        taken = client.fetch(clean, 0, 0, timeout_s=30)
        assert all(refusal(g, VOCAB) is None for g in taken) and len(taken) == clean
        tally.report(
            {"ingested": stats.ingested, **{f"invalid/{k}": n for k, n in stats.invalid.items()}}
        )
    finally:
        client.close()
        push.close()
