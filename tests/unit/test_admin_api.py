"""The admin endpoint: auth, live-key checks (422/409), atomic audited patches, actions,
Prometheus text, run-directory files, and the ``streamrl admin`` CLI against a real server.

The controller is faked by ``FakeRun``, a ``RunControl`` holding a resolved config dict.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from streamrl.admin.api import create_app, prometheus_name, render_prometheus
from streamrl.admin.auth import TOKEN_ENV, read_token, resolve_token, token_matches, write_token
from streamrl.admin.server import start_admin
from streamrl.cli import main
from streamrl.config import AdminConfig, Config, ConfigError, to_dict

TOKEN = "test-token-0123456789abcdef"


class FakeRun:
    """A thread-safe stand-in for the controller: a config dict and a few flags."""

    def __init__(self, **overrides: Any) -> None:
        self._config = to_dict(Config())
        for dotted, value in overrides.items():
            section, key = dotted.split("__")
            self._config[section][key] = value
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.paused = self.stopped = False
        self.refuse: str | None = None

    def status(self) -> dict[str, Any]:
        return {
            "run": "fake",
            "mode": self._config["run"]["mode"],
            "state": "paused" if self.paused else "running",
            "version": 3,
            "steps_per_s": 0.5,
            "tokens_per_s": 1234.0,
            "roles": {"learner-0": {"alive": True, "last_heartbeat": 1.0, "restarts": 0}},
            "shards": [{"shard_id": 0, "size": 5, "capacity": 256, "dropped": {"stale": 1}}],
            "staleness_hist": {"0": 4, "1": 1},
            "generators": [{"generator_id": 0, "applied_version": 3}],
        }

    def config(self) -> dict[str, Any]:
        with self.lock:
            return json.loads(json.dumps(self._config))

    def apply_live(self, changes: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        if self.refuse:
            raise ValueError(self.refuse)
        with self.lock:
            applied = {}
            for dotted, new in changes.items():
                section, key = dotted.split(".")
                applied[dotted] = (self._config[section][key], new)
                self._config[section][key] = new
            return applied

    def pause(self) -> None:
        self.calls.append("pause")
        self.paused = True

    def resume(self) -> None:
        self.calls.append("resume")
        self.paused = False

    def stop(self) -> None:
        self.calls.append("stop")
        self.stopped = True

    def checkpoint(self) -> dict[str, Any]:
        raise NotImplementedError("checkpoints are not implemented yet")

    def metrics(self) -> dict[str, float]:
        return {"reward/mean": 0.25, "buffer/size": 5, "throughput/tokens_per_s": 1234.0}


@pytest.fixture
def events() -> list[tuple[str, dict]]:
    return []


@pytest.fixture
def run(tmp_path: Path, events: list) -> tuple[FakeRun, TestClient]:
    fake = FakeRun()
    app = create_app(fake, TOKEN, run_dir=tmp_path, on_event=lambda k, f: events.append((k, f)))
    return fake, TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})


def audit_lines(run_dir: Path) -> list[dict]:
    path = run_dir / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --------------------------------------------------------------------------- auth


def test_health_and_docs_need_no_token(run):
    _, client = run
    bare = TestClient(client.app)
    assert bare.get("/health").json() == {"ok": True}
    assert bare.get("/docs").status_code == 200
    schema = bare.get("/openapi.json").json()
    assert {"/status", "/config", "/metrics", "/pause", "/stop"} <= set(schema["paths"])


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["missing", "wrong", "not-bearer"],
)
@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/status"),
        ("GET", "/metrics"),
        ("GET", "/config"),
        ("PATCH", "/config"),
        ("POST", "/pause"),
        ("POST", "/stop"),
    ],
)
def test_everything_else_needs_the_token(run, headers, method, path):
    fake, client = run
    bare = TestClient(client.app)
    answer = bare.request(method, path, headers=headers, json={"buffer.capacity": 1})
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert fake.calls == [] and fake.config()["buffer"]["capacity"] == 256


def test_token_comparison():
    assert token_matches(TOKEN, TOKEN)
    assert not token_matches(None, TOKEN)
    assert not token_matches(TOKEN[:-1], TOKEN)
    assert not token_matches("ünïcode", TOKEN)  # non-ASCII compares, never raises


def test_token_precedence_and_file_mode(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    first, second = resolve_token(None), resolve_token(None)
    assert first != second and len(first) >= 32  # random per run
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment-1234")
    assert resolve_token(None) == "from-the-environment-1234"
    assert resolve_token("from-the-config-123456") == "from-the-config-123456"
    with pytest.raises(ConfigError, match="printable ASCII"):
        resolve_token("has a space in it")
    (tmp_path / "admin.token").write_text("old")
    os.chmod(tmp_path / "admin.token", 0o644)  # an older, too open file is replaced
    path = write_token(tmp_path, first)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_token(tmp_path) == first


# --------------------------------------------------------------------------- PATCH /config


def test_patch_applies_and_is_audited(run, tmp_path, events):
    fake, client = run
    answer = client.patch(
        "/config", json={"buffer.capacity": 128, "generator.temperature": 1, "buffer.max_reuse": 1}
    )
    assert answer.status_code == 200, answer.text
    # Only real changes are reported and recorded; a value set to itself is not a change.
    assert answer.json()["changed"] == {"buffer.capacity": {"old": 256, "new": 128}}
    assert fake.config()["buffer"]["capacity"] == 128
    assert isinstance(fake.config()["generator"]["temperature"], float)  # converted to the type
    lines = audit_lines(tmp_path)
    assert [(x["key"], x["old"], x["new"]) for x in lines] == [("buffer.capacity", 256, 128)]
    assert lines[0]["client"] and lines[0]["time"] > 0
    assert events == [
        (
            "admin_set",
            {"key": "buffer.capacity", "old": 256, "new": 128, "client": lines[0]["client"]},
        )
    ]
    live = client.get("/status").json()["live"]
    assert live["buffer.capacity"] == 128 and live["buffer.sampling"] == "fifo"


@pytest.mark.parametrize(
    "patch,reason",
    [
        ({"buffer.capacity": 0}, "buffer.capacity: must be >= 1"),
        ({"buffer.capacity": "128"}, "buffer.capacity: Expected `int`, got `str`"),
        ({"buffer.capacity": 1.5}, "Expected `int`, got `float`"),
        ({"buffer.max_staleness": -1}, "must be >= 0"),
        ({"buffer.sampling": "lifo"}, "must be one of fifo|random|freshest"),
        ({"buffer.overflow": "spill"}, "must be one of drop-oldest|block"),
        ({"generator.temperature": 0}, "must be > 0"),
        ({"generator.prompts_per_call": True}, "Expected `int`, got `bool`"),
        ({"buffer.nope": 1}, "buffer.nope: unknown config key"),
        ({"buffer": {"capacity": 1}}, "a config section, not a key"),
        # One bad value spoils the whole patch, including its good keys.
        ({"buffer.capacity": 64, "buffer.max_reuse": 0}, "buffer.max_reuse: must be >= 1"),
        ({"buffer.capacity": 64, "learner.lr": "x", "no.such": 1}, "no.such: unknown"),
    ],
)
def test_bad_patch_is_422_and_changes_nothing(run, tmp_path, events, patch, reason):
    fake, client = run
    answer = client.patch("/config", json=patch)
    assert answer.status_code == 422
    assert reason in answer.json()["detail"]
    assert fake.config() == FakeRun().config()
    assert audit_lines(tmp_path) == [] and events == []


@pytest.mark.parametrize(
    "key,value", [("learner.lr", 1e-4), ("buffer.shards", 2), ("run.max_steps", 5), ("rewards", [])]
)
def test_non_live_key_is_409_naming_it(run, key, value):
    fake, client = run
    answer = client.patch("/config", json={"buffer.capacity": 64, key: value})
    assert answer.status_code == 409
    assert answer.json()["detail"] == f"{key} cannot change while the run is live"
    assert fake.config()["buffer"]["capacity"] == 256


def test_cross_key_rules(tmp_path):
    sync = FakeRun(run__mode="sync", buffer__max_staleness=0)
    client = TestClient(create_app(sync, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    answer = client.patch("/config", json={"buffer.max_staleness": 2})
    assert answer.status_code == 409 and "run.mode=sync" in answer.json()["detail"]
    uncorrected = FakeRun(algorithm__correction="none", buffer__max_staleness=0)
    client = TestClient(create_app(uncorrected, TOKEN), headers=client.headers)
    answer = client.patch("/config", json={"buffer.max_staleness": 1})
    assert answer.status_code == 422 and "correction=none" in answer.json()["detail"]


def test_controller_refusal_is_422_and_not_audited(run, tmp_path):
    fake, client = run
    fake.refuse = "shard 1 did not acknowledge"
    answer = client.patch("/config", json={"buffer.capacity": 64})
    assert answer.status_code == 422 and answer.json()["detail"] == "shard 1 did not acknowledge"
    assert audit_lines(tmp_path) == []


def test_empty_patch_changes_nothing(run, tmp_path):
    _, client = run
    assert client.patch("/config", json={}).json() == {"changed": {}}
    assert client.patch("/config", json=[1, 2]).status_code == 422  # not an object
    assert audit_lines(tmp_path) == []


def test_config_and_live_keys(tmp_path):
    fake = FakeRun(admin__token="a-secret-in-the-config")
    client = TestClient(create_app(fake, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    config = client.get("/config").json()
    assert config["admin"]["token"] == "<redacted>" and config["learner"]["lr"] == 1e-5
    live = client.get("/config/live").json()
    assert set(live) == {
        "buffer.capacity",
        "buffer.drop_zero_variance",
        "buffer.max_staleness",
        "buffer.sampling",
        "buffer.max_reuse",
        "buffer.overflow",
        "generator.temperature",
        "generator.prompts_per_call",
        "generator.count",
    }
    assert live["buffer.capacity"]["type"] == "int" and live["buffer.capacity"]["rule"] == ">= 1"


# --------------------------------------------------------------------------- actions, metrics


def test_actions_call_through_and_are_audited(run, tmp_path, events):
    fake, client = run
    for action in ("pause", "resume", "stop"):
        answer = client.post(f"/{action}")
        assert answer.status_code == 200 and answer.json() == {"ok": True}
    assert fake.calls == ["pause", "resume", "stop"] and fake.stopped
    assert [x["action"] for x in audit_lines(tmp_path)] == ["pause", "resume", "stop"]
    assert [kind for kind, _ in events] == ["admin_pause", "admin_resume", "admin_stop"]
    answer = client.post("/checkpoint")
    assert answer.status_code == 501 and "not implemented" in answer.json()["detail"]
    assert len(audit_lines(tmp_path)) == 3  # a refused action is not a change


def test_metrics_are_prometheus_text(run):
    _, client = run
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = answer.text.splitlines()
    assert "# TYPE streamrl_reward_mean gauge" in lines
    assert "streamrl_reward_mean 0.25" in lines
    assert "streamrl_buffer_size 5" in lines
    assert "streamrl_throughput_tokens_per_s 1234.0" in lines


def test_render_prometheus_edge_cases():
    text = render_prometheus(
        {
            "a/b": 1.0,
            "a.b": 2.0,
            "nan": float("nan"),
            "inf": float("inf"),
            "flag": True,
            "name": "text",
            "none": None,
        }
    )
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert samples == [
        "streamrl_a_b 2.0",
        "streamrl_flag 1",
        "streamrl_inf +Inf",
        "streamrl_nan NaN",
    ]  # sorted; the first of two colliding names wins
    assert prometheus_name("loss/kl-k3") == "streamrl_loss_kl_k3"
    assert render_prometheus({}) == ""


# --------------------------------------------------------------------------- real server + CLI


@pytest.fixture
def served(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    fake = FakeRun()
    server = start_admin(fake, AdminConfig(host="127.0.0.1", port=0), tmp_path)
    yield fake, server, tmp_path
    server.stop()


def test_real_server_files_and_http(served):
    fake, server, run_dir = served
    url = (run_dir / "admin.url").read_text().strip()
    assert url == server.url and url.startswith("http://127.0.0.1:") and server.port > 0
    assert stat.S_IMODE((run_dir / "admin.token").stat().st_mode) == 0o600
    token = read_token(run_dir)
    assert httpx.get(f"{url}/health").json() == {"ok": True}
    assert httpx.get(f"{url}/docs").status_code == 200
    assert httpx.get(f"{url}/status").status_code == 401
    answer = httpx.get(f"{url}/status", headers={"Authorization": f"Bearer {token}"})
    assert answer.json()["version"] == 3


def test_cli_against_a_real_server(served, capsys):
    fake, server, run_dir = served
    run = ["--run", str(run_dir)]

    assert main(["admin", "status", *run]) == 0
    out = capsys.readouterr().out
    assert "run fake (async) running: version 3" in out and "1234 tokens/s" in out
    assert "learner-0" in out and "5/256" in out and "staleness: 0:4 1:1" in out

    assert main(["admin", "set", "buffer.capacity=128", "buffer.sampling=random", *run]) == 0
    out = capsys.readouterr().out
    assert "buffer.capacity: 256 -> 128" in out and "buffer.sampling: 'fifo' -> 'random'" in out
    assert main(["admin", "status", "--json", *run]) == 0
    assert json.loads(capsys.readouterr().out)["live"]["buffer.capacity"] == 128

    assert main(["admin", "set", "buffer.capacity=0", *run]) == 1
    assert "422 Unprocessable" in capsys.readouterr().err
    assert main(["admin", "set", "learner.lr=0.1", *run]) == 1
    err = capsys.readouterr().err
    assert "409 Conflict: learner.lr cannot change while the run is live" in err
    assert len(err.strip().splitlines()) == 1

    for action in ("pause", "resume", "stop"):
        assert main(["admin", action, *run]) == 0
        assert capsys.readouterr().out.strip() == f"{action}: ok"
    assert fake.calls == ["pause", "resume", "stop"]
    assert main(["admin", "checkpoint", *run]) == 1
    assert "501" in capsys.readouterr().err
    assert [x.get("key", x.get("action")) for x in audit_lines(run_dir)] == [
        "buffer.capacity",
        "buffer.sampling",
        "pause",
        "resume",
        "stop",
    ]

    write_token(run_dir, "not-the-token-of-this-run")
    assert main(["admin", "status", *run]) == 1
    assert "401 Unauthorized" in capsys.readouterr().err


def test_cli_errors_without_a_run(served, tmp_path, capsys):
    _, server, run_dir = served
    assert main(["admin", "status", "--run", str(tmp_path / "missing")]) == 1
    assert "is not a directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["admin", "status", "--run", str(empty)]) == 1
    assert "admin.url not found" in capsys.readouterr().err
    server.stop()
    assert main(["admin", "status", "--run", str(run_dir)]) == 1
    assert "cannot reach the run" in capsys.readouterr().err
    assert main(["admin", "set", "buffer.capacity", "--run", str(run_dir)]) == 2  # not KEY=VALUE


def test_cli_errors_when_something_else_holds_the_runs_port(tmp_path, capsys):
    """A finished run's admin port taken by a process that does not speak HTTP: one line."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_garbage() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f\r\n\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "admin.url").write_text(f"http://127.0.0.1:{port}")
    write_token(run_dir, "a-token")
    try:
        assert main(["admin", "stop", "--run", str(run_dir)]) == 1
    finally:
        thread.join(5)
        listener.close()
    err = capsys.readouterr().err
    assert "does not answer as the run's admin endpoint" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_stays_light():
    """``streamrl --help`` and ``streamrl admin`` import neither the server side nor torch/ray."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from streamrl.cli import main\n"
        "main(['admin', 'status', '--run', '/nonexistent-run-dir'])\n"
        "heavy = ('fastapi', 'uvicorn', 'starlette', 'torch', 'ray')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
