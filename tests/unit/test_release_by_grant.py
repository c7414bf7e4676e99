"""Release by grant identity: a generator whose served scores settle its groups out of grant
order pushes them in that order; when it dies, the controller returns exactly the prompts
no shard has (``ShardPushers.address``, ``PromptLedger.release`` with the shards' floors
and the seqs above them). Real scoring client and shards' ``Delivered``, no controller."""

from __future__ import annotations

import msgspec
import zmq
from test_scoring_client import _group, _pump_until, _Role

from streamrl.buffers.delivery import Delivered
from streamrl.config import Config, RewardSpec, ScoringConfig
from streamrl.controller.state import GeneratorHealth, PromptLedger, RunState
from streamrl.protocol import ShardStats, TrajectoryGroup
from streamrl.workers.generation.generator_sockets import ShardPushers
from streamrl.workers.generation.scoring import GroupScoring

SENDER = "0123456789ab"


class _Shard:
    """A shard's door: every frame pushed to it is delivered (its ``Delivered`` floors)."""

    def __init__(self) -> None:
        self.delivered = Delivered()
        self.decoder = msgspec.msgpack.Decoder(TrajectoryGroup)
        self.prompts: list[int] = []

    def send(self, frame: bytes) -> None:
        group = self.decoder.decode(frame)
        assert self.delivered.add(group.group_id, group.sender, group.seq)
        self.prompts.append(group.prompt_index)

    def stats(self, shard_id: int) -> ShardStats:
        above = {s: sorted(a) for s, a in self.delivered.above.items()}
        return ShardStats(
            shard_id, 0, 64, 0, 0, {}, 0, delivered=self.delivered.floors(), delivered_above=above
        )


def test_groups_settled_out_of_order_release_exactly_the_unpushed_prompts() -> None:
    ctx = zmq.Context()
    role = _Role(ctx)
    config = Config(rewards=[RewardSpec(model="/models/rm")], scoring=ScoringConfig(timeout_s=30))
    scoring = GroupScoring(
        ctx, config, {0: role.endpoint}, "gen-0", lambda g: "q", lambda g, served: None
    )
    state = RunState(prompts=PromptLedger(next_index=10))
    state.health[0] = GeneratorHealth(sender=SENDER)
    shards = [_Shard(), _Shard()]
    pushers = ShardPushers(shards, SENDER, generator_id=0)
    try:
        # Two grants (as admission hands them out): prompts 10..14, then 15, 16.
        grants = [state.prompts.grant(0, 5), state.prompts.grant(0, 2)]
        for indices in grants:
            first = pushers.take_grant(len(indices))
            groups = [_group(i) for i in indices]
            pushers.address(groups, first)
            scoring.submit(groups)
        requests = {r.items[0].response.split(".")[0]: (p, r) for p, r in role.take(7)}
        for prompt in (14, 11, 16, 12):  # the role answers these; 10, 13 and 15 wait
            role.answer(*requests[f"answer {prompt}"])
        settled = _pump_until(scoring, 4)
        assert sorted(g.prompt_index for g in settled) == [11, 12, 14, 16]
        pushers.push(settled)  # in settle order, never the grant order
        # The generator dies here. Grant k is shard k % 2's seq k // 2: shard 0 holds grants
        # 2, 4 and 6 (seqs 1-3) above an empty floor; shard 1 grant 1 (seq 0).
        assert sorted(shards[0].prompts) == [12, 14, 16] and shards[1].prompts == [11]
        state.shards = {s: shard.stats(s) for s, shard in enumerate(shards)}
        floors = state.arrived_from(0, shards=2)
        assert floors == {0: -1, 1: 0}
        assert state.release_generator(0, floors) == 3
        assert sorted(state.prompts.retry) == [10, 13, 15]  # exactly what no shard has
    finally:
        scoring.close()
        ctx.destroy(linger=0)
