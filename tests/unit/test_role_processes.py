"""Teardown signals a role's process by its identity (pid plus start time), never a bare pid:
a pid the OS has given to another process since is left alone (issue 40, item 4)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from streamrl.controller import processes
from streamrl.controller.processes import ProcessIdentity
from streamrl.controller.roles import RoleId, Roles, RoleSlot


@pytest.fixture
def spawn() -> Iterator:
    """Start idle processes of our own; each is ended (by its pid) after the test."""
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _slot(actor: str, pid: int, incarnation: int = 0) -> RoleSlot:
    """A role whose pid was just learned (``refresh_pids`` reads its identity then)."""
    return RoleSlot(actor, pid=pid, process=ProcessIdentity.of(pid), incarnation=incarnation)


def test_reap_leaves_alone_a_pid_now_held_by_another_process(spawn, tmp_path):
    stranger = spawn()
    # The role's process started one tick before the process that holds its pid now: it
    # ended, and the OS gave its pid to someone else's process.
    earlier = ProcessIdentity(stranger.pid, processes.start_ticks(stranger.pid) - 1)
    roles = Roles()
    roles.put(RoleId.generator(0), RoleSlot("gen-0", pid=stranger.pid, process=earlier))
    roles.write_pids(tmp_path / "pids.json", controller_pid=1)
    assert json.loads((tmp_path / "pids.json").read_text())["roles"] == []  # seen gone
    roles.reap(timeout_s=0.2)
    assert stranger.poll() is None, "reap killed a process that was not the run's"
    assert not earlier.send(signal.SIGKILL)
    assert stranger.poll() is None


def test_reap_kills_a_role_process_that_outlives_the_wait(spawn, tmp_path):
    role = spawn()
    roles = Roles()
    roles.put(RoleId.learner(0), _slot("rank-0", role.pid))
    roles.write_pids(tmp_path / "pids.json", controller_pid=1)
    roles.reap(timeout_s=0.2)
    assert role.wait(timeout=10) == -signal.SIGKILL


def test_a_replaced_role_stays_in_pids_json_until_its_process_is_gone(spawn, tmp_path):
    path = tmp_path / "pids.json"
    first, second = spawn(), spawn()
    roles = Roles()
    roles.put(RoleId.generator(1), _slot("gen-1", first.pid))
    roles.write_pids(path, controller_pid=1)
    roles.put(RoleId.generator(1), _slot("gen-1b", second.pid, incarnation=1))
    roles.write_pids(path, controller_pid=1)
    pids = json.loads(path.read_text())
    assert pids["roles"] == sorted([first.pid, second.pid])  # the old one may still be exiting
    assert pids["by_role"] == {"generator 1": second.pid}
    first.kill()
    first.wait()
    roles.write_pids(path, controller_pid=1)
    pids = json.loads(path.read_text())
    assert pids["roles"] == [second.pid]
    assert pids["start_ticks"] == {str(second.pid): processes.start_ticks(second.pid)}
