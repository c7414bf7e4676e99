"""The controller's reward roles (controller.reward_roles.RewardPool) without Ray: what a
dead role was scoring becomes its successor's suspects, and refused after a second death;
a reload that fails is tried again after a backoff within ``run.max_restarts``; a restarted
role's endpoint reaches the generators' receipts."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from streamrl.config import Config, RewardSpec, RunConfig
from streamrl.controller import reward_roles
from streamrl.controller.context import RunContext
from streamrl.controller.roles import RoleId, RoleSlot
from streamrl.controller.rundir import RunError
from streamrl.controller.state import RunState
from streamrl.protocol import RewardRoleReport
from streamrl.role_specs import RewardRoleSpec


class _Roles:
    def __init__(self) -> None:
        self.slots: dict[RoleId, RoleSlot] = {}
        self.killed: list[str] = []

    def put(self, role: RoleId, slot: RoleSlot) -> None:
        self.slots[role] = slot

    def forget(self, role: RoleId) -> RoleSlot | None:
        return self.slots.pop(role, None)

    def kill(self, role: RoleId) -> None:
        if role in self.slots:
            self.killed.append(str(role))

    def of_kind(self, kind: str) -> dict[int, RoleSlot]:
        return {r.index: s for r, s in self.slots.items() if r.kind == kind}


class _Specs:
    bind_host = "127.0.0.1"

    def reward_role(self, index: int, model_dir: str, port: int, incarnation: int):
        config = Config(rewards=[RewardSpec(model=model_dir)])
        return RewardRoleSpec(
            log_file="-",
            bind_host=self.bind_host,
            config=config,
            index=index,
            model_dir=model_dir,
            report_endpoint="tcp://127.0.0.1:1",
            port=port,
            incarnation=incarnation,
        )


class _Pool(reward_roles.RewardPool):
    """The real pool; its roles are stand-ins whose scorer loads or fails as told."""

    def __init__(self, ctx: RunContext, loads: list[bool]) -> None:
        super().__init__(ctx, {0: "/models/rm"})
        self.loads, self.launched = loads, []

    def _launch(self, index: int, incarnation: int) -> RoleSlot:
        spec = self._spec(index, incarnation)
        self.launched.append(spec)
        actor = SimpleNamespace(serve=SimpleNamespace(remote=lambda: "run-ref"))
        slot = RoleSlot(actor, incarnation=incarnation)
        self.ctx.roles.put(RoleId.reward(index), slot)
        return slot

    def _await_endpoint(self, index: int, slot: RoleSlot) -> str:
        if not self.loads.pop(0):
            raise RunError(f"reward role {index} (rm): OSError: no such file")
        return f"tcp://10.0.0.{slot.incarnation + 1}:{5000 + slot.incarnation}"


def _context(tmp_path, max_restarts: int = 3) -> RunContext:
    config = Config(
        rewards=[RewardSpec(model="/models/rm")], run=RunConfig(max_restarts=max_restarts)
    )
    metrics = SimpleNamespace(event=lambda *a, **k: None)
    return RunContext(
        config, RunState(), None, None, _Roles(), _Specs(), tmp_path, metrics, io.StringIO()
    )


def _died_scoring(ctx: RunContext, incarnation: int, ids: list[str]) -> None:
    report = RewardRoleReport(0, incarnation, "rm", "rm@x", 0.0, scoring_ids=ids)
    ctx.state.reward_role_report(report)


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch) -> None:
    monkeypatch.setattr(reward_roles, "RELOAD_BACKOFF_S", 0.01)


def test_a_request_two_incarnations_died_scoring_is_quarantined(tmp_path) -> None:
    ctx = _context(tmp_path)
    pool = _Pool(ctx, loads=[True, True, True])
    pool._ready(0, pool._launch(0, 0))
    _died_scoring(ctx, 0, ["g-3", "g-4"])
    pool.restart(0, "exited early")
    assert pool.launched[-1].suspects == {"g-3": 1, "g-4": 1}  # scored alone by the next
    _died_scoring(ctx, 1, ["g-4"])
    pool.restart(0, "exited early")
    assert pool.launched[-1].suspects == {"g-3": 1, "g-4": 2}  # g-4 is refused by the next
    assert ctx.state.scorer_epochs[0] == 2 and ctx.state.restarts["reward role 0"] == 2


def test_a_failed_reload_is_tried_again_within_max_restarts(tmp_path) -> None:
    ctx = _context(tmp_path, max_restarts=3)
    pool = _Pool(ctx, loads=[True, False, True])
    pool._ready(0, pool._launch(0, 0))
    pool.restart(0, "exited early")  # the first reload fails, the second serves
    assert [s.incarnation for s in pool.launched] == [0, 1, 2]
    assert ctx.state.scorer_epochs[0] == 2 and ctx.state.restarts["reward role 0"] == 2
    assert ctx.state.failures["reward role 0"].startswith("reload failed: reward role 0")


def test_reloads_that_keep_failing_end_the_run_at_max_restarts(tmp_path) -> None:
    ctx = _context(tmp_path, max_restarts=2)
    pool = _Pool(ctx, loads=[True, False, False, False])
    pool._ready(0, pool._launch(0, 0))
    with pytest.raises(RunError, match="failed 3 times .*reload failed"):
        pool.restart(0, "exited early")
    assert len(pool.launched) == 3  # the role, then two reloads


def test_a_restarted_role_s_new_endpoint_goes_out_with_its_epoch(tmp_path, ctx) -> None:
    """A role restarted on another node is reachable: admission replies carry where it
    listens now beside its epoch (``Receipts.scorer_endpoints``)."""
    import zmq

    from streamrl.config import BufferConfig
    from streamrl.controller.admission import AdmissionServer
    from streamrl.controller.staleness import AdmissionPolicy
    from streamrl.protocol import AdmissionReply, AdmissionRequest
    from streamrl.transport import Codec, make_socket

    run = _context(tmp_path)
    pool = _Pool(run, loads=[True, True])
    pool._ready(0, pool._launch(0, 0))
    pool.restart(0, "exited early")
    policy = AdmissionPolicy(2, BufferConfig(max_staleness=0), run.state)
    server = AdmissionServer(ctx, policy, run.state)
    sock = make_socket(ctx, zmq.DEALER)
    sock.connect(server.endpoint)
    codec: Codec[AdmissionReply] = Codec(AdmissionReply, "test")
    try:
        sock.send(codec.encode(AdmissionRequest(0, 0)))
        assert sock.poll(5000), "no admission reply"
        receipts = codec.decode(sock.recv()).parts().receipts
        assert receipts.scorer_epochs == {0: 1}
        assert receipts.scorer_endpoints == {0: "tcp://10.0.0.2:5001"}
    finally:
        sock.close()
        server.close()


def test_a_role_that_died_before_reporting_blames_nobody(tmp_path) -> None:
    ctx = _context(tmp_path)
    pool = _Pool(ctx, loads=[True, True, True])
    pool._ready(0, pool._launch(0, 0))
    _died_scoring(ctx, 0, ["g-3"])
    pool.restart(0, "exited early")
    pool.restart(0, "exited early")  # incarnation 1 died before its first report
    assert pool.launched[-1].suspects == {"g-3": 1}
