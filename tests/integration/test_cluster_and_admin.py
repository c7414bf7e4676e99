"""Operating a run: the admin endpoint on a live run, and joining an existing Ray cluster.

Runs are real `streamrl launch` processes; everything binds 127.0.0.1; each test ends only
the processes it started, by pid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from support import ONE_GENERATOR, ONE_LEARNER, alive, launch_tiny, wait_until

from streamrl.cli import main as cli
from streamrl.transport import free_port

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _assert_loopback_only(root_pid: int) -> None:
    """Every socket the run listens on (controller, Ray, every role) is on loopback."""
    import psutil

    root = psutil.Process(root_pid)
    listening = []
    for process in [root, *root.children(recursive=True)]:
        try:
            connections = process.net_connections(kind="inet")
        except psutil.Error:  # ended meanwhile
            continue
        listening += [c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN]
    assert listening, "found no listening sockets at all"
    exposed = [ip for ip in listening if ip not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert not exposed, exposed


def test_admin_endpoint_on_a_live_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "live"
    proc = launch_tiny(run_dir, "run.max_steps=400", "buffer.max_staleness=2", *ONE_LEARNER)
    try:
        url = wait_until(
            lambda: (
                (run_dir / "admin.url").is_file() and (run_dir / "admin.url").read_text().strip()
            ),
            120,
            "admin.url",
        )
        token = (run_dir / "admin.token").read_text().strip()
        assert (run_dir / "admin.token").stat().st_mode & 0o777 == 0o600
        auth = {"Authorization": f"Bearer {token}"}
        http = httpx.Client(base_url=url, timeout=30)
        assert http.get("/health").status_code == 200
        assert http.get("/status").status_code == 401
        assert http.get("/status", headers={"Authorization": "Bearer nope"}).status_code == 401
        status = lambda: http.get("/status", headers=auth).json()  # noqa: E731
        wait_until(lambda: status()["version"] >= 2, 120, "two learner steps")
        _assert_loopback_only(proc.pid)

        assert http.patch("/config", headers=auth, json={"buffer.capacity": 0}).status_code == 422
        assert http.patch("/config", headers=auth, json={"learner.lr": 1.0}).status_code == 409
        answer = http.patch(
            "/config", headers=auth, json={"buffer.capacity": 7, "buffer.max_staleness": 1}
        )
        assert answer.status_code == 200, answer.text
        version = status()["version"]
        # The shards' own stats follow within a step.
        wait_until(
            lambda: (
                status()["version"] >= version + 1
                and all(s["capacity"] == 7 for s in status()["shards"])
            ),
            120,
            "shard capacity 7",
        )
        assert status()["admission"]["max_staleness"] == 1
        # Two steps later every consumed batch respects the new bound.
        later = status()["version"] + 2
        wait_until(lambda: status()["version"] >= later, 120, "two more steps")
        metrics = http.get("/metrics", headers=auth).text
        staleness_max = next(
            float(line.split()[1])
            for line in metrics.splitlines()
            if line.startswith("streamrl_staleness_max ")
        )
        assert staleness_max <= 1
        audit = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
        assert {(a.get("key"), a.get("new")) for a in audit} >= {
            ("buffer.capacity", 7),
            ("buffer.max_staleness", 1),
        }

        # CLI: pause stops admission (the version stalls), resume restarts it.
        assert cli(["admin", "pause", "--run", str(run_dir)]) == 0
        assert status()["state"] == "paused"
        time.sleep(3)  # groups already admitted may still finish a step or two
        paused_at = status()["version"]
        time.sleep(3)
        assert status()["version"] <= paused_at + 1
        assert cli(["admin", "resume", "--run", str(run_dir)]) == 0
        wait_until(lambda: status()["version"] > paused_at + 1, 120, "progress after resume")
        assert cli(["admin", "set", "generator.temperature=0.8", "--run", str(run_dir)]) == 0
        wait_until(
            lambda: any(
                "temperature -> 0.8" in f.read_text()
                for f in (run_dir / "logs").glob("generator-*.log")
            ),
            120,
            "a generator sampling at the new temperature",
        )
        assert cli(["admin", "status", "--run", str(run_dir)]) == 0

        assert cli(["admin", "checkpoint", "--run", str(run_dir)]) == 0
        wait_until(lambda: (run_dir / "checkpoints" / "latest").is_file(), 120, "a checkpoint")
        assert cli(["admin", "stop", "--run", str(run_dir)]) == 0
        assert proc.wait(120) == 0, proc.stdout.read()
    finally:
        _end(proc)
    pids = json.loads((run_dir / "pids.json").read_text())
    assert not [p for p in [pids["controller"], *pids["roles"]] if alive(p)]
    assert (run_dir / "hf" / "config.json").is_file()  # a graceful stop still exports
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "admin_set" for e in events)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_launch_joins_a_loopback_cluster(tmp_path: Path) -> None:
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's unix socket paths
    # Head and driver agree explicitly on token auth (the token lives in ~/.ray/auth_token).
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"}
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    run_dir = tmp_path / "cluster"
    try:
        wait_until(lambda: _port_open(port), 60, "the Ray head")
        _assert_loopback_only(head.pid)
        proc = launch_tiny(
            run_dir, "run.max_steps=3", *ONE_GENERATOR, "--address", f"127.0.0.1:{port}", env=env
        )
        try:
            output, _ = proc.communicate(timeout=300)
        finally:
            _end(proc)
        assert proc.returncode == 0, output
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["version"] == 3
        assert all(g["applied_version"] == 3 for g in summary["generators"].values())
    finally:
        head.send_signal(signal.SIGTERM)  # --block: the head ends the processes it started
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()


def test_unreachable_cluster_is_one_line(tmp_path: Path) -> None:
    proc = launch_tiny(tmp_path / "nowhere", "--address", f"127.0.0.1:{free_port()}")
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        _end(proc)
    assert proc.returncode == 1
    assert "cannot reach the Ray cluster" in output.strip().splitlines()[-1]
