"""Each row of the live-knob table reaches every role it names, through the real paths: a
shard's ``Reconfigure`` over its socket, the admission server's next reply, the learners'
``set_live`` and the generator pool's target."""

from __future__ import annotations

import threading
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq

from streamrl.admin.live import config_key_types, validate_patch
from streamrl.config import BufferConfig, load_config, to_dict
from streamrl.controller.admission import AdmissionServer
from streamrl.controller.knobs import LIVE_KEYS, ROLES, get_key
from streamrl.controller.live import LiveRun
from streamrl.controller.roles import Roles
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.state import GeneratorHealth, RunState
from streamrl.controller.supervisor import GeneratorPool
from streamrl.protocol import AdmissionReply, AdmissionRequest, Directives, Reconfigure
from streamrl.transport import Codec, make_socket


class _Learner:
    """Test double of a learner actor handle: records ``set_live.remote`` calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.set_live = SimpleNamespace(remote=lambda key, value: self.calls.append((key, value)))


def _changed(key: str, old: Any) -> Any:
    tp = config_key_types()[key]
    if typing.get_origin(tp) is typing.Literal:
        return next(v for v in typing.get_args(tp) if v != old)
    if isinstance(old, bool):
        return not old
    return old + 1 if isinstance(old, int) else old / 2


def test_every_row_names_known_roles_and_fields() -> None:
    for row in LIVE_KEYS.values():
        assert row.reaches and set(row.reaches) <= set(ROLES), row.key
        if "shards" in row.reaches:
            assert row.field in Reconfigure.__struct_fields__, row.key
        if "generators" in row.reaches:
            assert row.field in Directives.__struct_fields__, row.key
            assert hasattr(RunState(), row.field), row.key
        if "admission" in row.reaches:
            assert hasattr(AdmissionPolicy(1, BufferConfig(), RunState()), row.field), row.key


@pytest.mark.parametrize("key", sorted(LIVE_KEYS))
def test_a_live_key_reaches_every_role_it_names(key: str, tmp_path: Path) -> None:
    from streamrl.buffers.server import BufferShard

    row = LIVE_KEYS[key]
    config = load_config(None, ["generator.count=2"])
    old = get_key(config, key)
    new = validate_patch({key: _changed(key, old)}, to_dict(config))[key]
    state = RunState()
    state.health[0] = GeneratorHealth()
    policy = AdmissionPolicy(config.learner.groups_per_step, config.buffer, state)
    ctx = zmq.Context()
    admission = AdmissionServer(ctx, policy, state)
    shard = BufferShard(config.buffer, 0, log_dir=tmp_path)
    serving = threading.Thread(target=shard.serve, daemon=True)
    serving.start()
    learners = [_Learner(), _Learner()]
    controller = SimpleNamespace(
        config=config, state=state, policy=policy, learners=learners, run_dir=tmp_path
    )
    live = LiveRun(
        config=config,
        state=state,
        policy=policy,
        learners=lambda: learners,
        figures=controller,
        request_stop=lambda: None,
        checkpoint_dir=tmp_path / "checkpoints",
        shard_endpoints=[shard.request_endpoint],
    )
    try:
        assert live.apply_live({key: new}) == {key: (old, new)}
        assert get_key(config, key) == new
        section, name = key.split(".")
        assert live.config()[section][name] == new  # what GET /config and /status read
        reached = {
            "shards": getattr(shard.store.policy, row.field, None) == new,
            "admission": getattr(policy, row.field, None) == new,
            "learners": all(learner.calls == [(key, new)] for learner in learners),
            "generators": getattr(_ask(ctx, admission.endpoint), row.field, None) == new,
            "supervisor": _pool_target(controller) == new,
        }
        assert {role for role, ok in reached.items() if ok} >= set(row.reaches)
        # And nothing else moved: a role the row does not name kept its old value.
        untouched = {
            "shards": getattr(shard.store.policy, row.field, old) == old,
            "learners": all(not learner.calls for learner in learners),
        }
        for role, ok in untouched.items():
            assert role in row.reaches or ok, role
    finally:
        live.close()
        shard.stop()
        serving.join(timeout=5)
        shard.close()
        admission.close()
        ctx.destroy(linger=0)


def _ask(ctx: zmq.Context, endpoint: str) -> Directives:
    """The directives of an admission reply: where the live generator knobs ride."""
    sock = make_socket(ctx, zmq.DEALER)
    sock.connect(endpoint)
    codec: Codec[AdmissionReply] = Codec(AdmissionReply, "test")
    try:
        sock.send(codec.encode(AdmissionRequest(0, 0)))
        assert sock.poll(5000)
        return codec.decode(sock.recv()).parts().directives
    finally:
        sock.close()


def _pool_target(controller: SimpleNamespace) -> int:
    """The number of generators the pool converges to after one pass, from the live config
    (its start is recorded, not run: no Ray here)."""
    ctx = SimpleNamespace(
        config=controller.config, state=controller.state, roles=Roles(), note=lambda m: None
    )
    pool = GeneratorPool(ctx)  # type: ignore[arg-type]
    started: list[int] = []
    pool.start = started.append  # type: ignore[method-assign]
    pool._scale(controller.config.generator.count)
    return len(started)
