"""``streamrl.train``: a run from Python on the tiny job, a notebook's reward function sent to the
generator by value, and callables that could not reach the roles refused before anything
starts (``streamrl.api``, ``streamrl.callables``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import streamrl
from streamrl.config import ConfigError

pytestmark = pytest.mark.slow

# The tiny job on one learner and one generator (2 cores), two steps.
SMALL = [
    "learner.count=1",
    "generator.count=1",
    "run.max_steps=2",
    "logging.progress=true",  # off a terminal: the step lines alone (metrics.MetricsLog)
]


def _verl_rows(n: int) -> list[dict]:
    """Arithmetic questions in verl's layout, the rows ``data.source`` reads by default."""
    return [
        {"prompt": f"What is {a} + {a + 3}?", "reward_model": {"ground_truth": str(2 * a + 3)}}
        for a in range(n)
    ]


def _make_reward(marker: float, calls: Path):
    """A notebook-style reward: a closure (over ``marker`` and ``calls``), so cloudpickle must
    send it by value. It pays ``marker`` or ``marker + 1`` by a hash of the response (groups
    must differ in reward, or they are dropped), far from any built-in reward's range, and
    notes the process it ran in."""

    def reward(sample: streamrl.RewardInput) -> float:
        import os
        import zlib

        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\n")
        return marker + zlib.crc32(sample.response_text.encode()) % 2

    return reward


def test_import_streamrl_is_light_and_exports_the_api() -> None:
    """``import streamrl`` runs in every role and in ``streamrl --help``: no torch, no Ray."""
    code = (
        "import sys, streamrl\n"
        "heavy = {'torch', 'ray', 'zmq', 'streamrl.api', 'streamrl.rewards'}\n"
        "assert not heavy & set(sys.modules), sorted(heavy & set(sys.modules))\n"
        "assert callable(streamrl.train) and streamrl.load_config\n"
        "assert streamrl.RunResult and streamrl.Config and streamrl.RewardInput\n"
        "assert 'torch' not in sys.modules and 'ray' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert sorted(streamrl.__all__) == [
        "Config",
        "RewardInput",
        "RunResult",
        "load_config",
        "train",
    ]


def test_train_runs_a_closure_reward_in_the_generator(tmp_path: Path, capsys) -> None:
    import datasets

    calls = tmp_path / "calls.txt"
    reward = _make_reward(40.0, calls)
    sigterm = signal.getsignal(signal.SIGTERM)
    result = streamrl.train(
        model="tiny-random-llama",
        dataset=datasets.Dataset.from_list(_verl_rows(48)),
        rewards=[reward],
        config="tiny",
        overrides=[
            *SMALL,
            f"run.output_dir={tmp_path}",
            "eval.every=2",
            "eval.max_prompts=4",
        ],
        name="api",
    )
    run_dir = tmp_path / "api"
    assert result.run_dir == run_dir and result.summary["version"] == 2
    # The controller's and Ray's SIGTERM handlers went with the run: this process goes on.
    assert signal.getsignal(signal.SIGTERM) == sigterm
    assert result.summary == json.loads((run_dir / "summary.json").read_text())
    assert (result.model_dir / "config.json").is_file()

    # The config names the callable; the dataset is the run directory's save_to_disk copy.
    assert [r.name for r in result.config.rewards] == ["python:test_python_api._make_reward.reward"]
    assert "python:test_python_api._make_reward.reward" in (run_dir / "config.yaml").read_text()
    assert result.config.data.source == str((run_dir / "dataset").resolve())
    assert datasets.load_from_disk(str(run_dir / "dataset")).num_rows == 48

    # It ran, and not here: in the generator's process, for training and for evaluation.
    pids = {int(line) for line in calls.read_text().split()}
    assert pids and os.getpid() not in pids
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    means = [r["reward/mean"] for r in steps if "step" in r]
    assert len(means) == 2 and all(40.0 <= m <= 41.0 for m in means), means
    assert result.final_eval is not None and result.final_eval["version"] == 2
    assert 40.0 <= result.final_eval["eval/reward_mean"] <= 41.0

    # Progress reached sys.stdout (not a terminal here) as plain lines.
    out = capsys.readouterr().out
    assert "step    2 | reward 40." in out and "wall time" in out


def test_callables_the_roles_cannot_load_fail_before_anything_starts(tmp_path: Path) -> None:
    overrides = [*SMALL, f"run.output_dir={tmp_path}"]
    sock = socket.socket()
    try:

        def holds_a_socket(sample: streamrl.RewardInput) -> float:
            return float(sock.fileno())

        with pytest.raises(ConfigError) as refused:
            streamrl.train(config="tiny", rewards=[holds_a_socket], overrides=overrides)
    finally:
        sock.close()
    message = str(refused.value)
    assert "holds_a_socket" in message and "socket" in message and "\n" not in message

    # A module only this process can import (a directory put on sys.path at run time):
    # cloudpickle sends its function by name, which no role could resolve.
    local = tmp_path / "local_code"
    local.mkdir()
    (local / "only_here_rewards.py").write_text(
        textwrap.dedent(
            """
            def constant(sample):
                return 1.0
            """
        )
    )
    sys.path.insert(0, str(local))
    try:
        import only_here_rewards

        with pytest.raises(ConfigError) as refused:
            streamrl.train(
                config="tiny",
                rewards=[("numeric_match", 0.5), only_here_rewards.constant],
                overrides=overrides,
            )
    finally:
        sys.path.remove(str(local))
        sys.modules.pop("only_here_rewards", None)
    message = str(refused.value)
    assert "reward constant (python:only_here_rewards.constant)" in message
    assert "No module named 'only_here_rewards'" in message and "\n" not in message
    # Refused before the run: no run directory, no role.
    assert [p.name for p in tmp_path.iterdir()] == ["local_code"]


@pytest.fixture
def launched(monkeypatch) -> dict:
    """``controller.run.launch`` replaced: the config it was given is kept under ``config``,
    and an empty summary is written where the run would write its own."""
    import streamrl.controller.run as run_module

    seen: dict = {}

    def fake_launch(config, address=None, console=None):
        run_dir = Path(config.run.output_dir) / config.run.name
        run_dir.mkdir(parents=True, exist_ok=True)
        seen["config"] = config
        (run_dir / "summary.json").write_text(json.dumps({"version": 0, "eval": []}))
        return {"run_dir": str(run_dir)}

    monkeypatch.setattr(run_module, "launch", fake_launch)
    return seen


def test_a_dataset_becomes_a_save_to_disk_directory_named_in_data_source(
    tmp_path: Path, launched: dict
) -> None:
    """Up to the launch: the Dataset is saved in the run directory, and the config the
    controller gets reads it there."""
    import datasets

    from streamrl.data import check_data, prompt_stream

    splits = datasets.DatasetDict(
        train=datasets.Dataset.from_list(_verl_rows(16)),
        test=datasets.Dataset.from_list(_verl_rows(4)),
    )
    result = streamrl.train(
        dataset=splits,
        config={"run": {"output_dir": str(tmp_path), "name": "staged"}, "eval.every": 0},
        overrides=["model.name=tiny-random-llama"],
    )
    staged = (tmp_path / "staged" / "dataset").resolve()
    config = launched["config"]
    assert config.data.source == str(staged) and result.config == config
    assert result.final_eval is None
    reloaded = datasets.load_from_disk(str(staged))
    assert {name: split.num_rows for name, split in reloaded.items()} == {"train": 16, "test": 4}
    check_data(config)  # data.source reads the directory (streamrl.tables)
    assert prompt_stream(config)[0].ground_truth.isdigit()

    # Another call under the same name: taken by the first one (its summary.json).
    with pytest.raises(Exception, match="already exists"):
        streamrl.train(dataset=splits, config=config)


def test_an_environment_class_is_named_and_resolves(tmp_path: Path, launched: dict) -> None:
    from streamrl.envs import Environment, StepResult, check_env, resolve_env

    class Halve(Environment):  # defined in a function: sent by value
        def reset(self, prompt):
            self.truth = prompt.ground_truth

        def step(self, text):
            return StepResult(reward=float(self.truth in text), done=True)

    result = streamrl.train(
        env=Halve, config="guess", overrides=[f"run.output_dir={tmp_path}", "run.name=env"]
    )
    name = "python:test_python_api.test_an_environment_class_is_named_and_resolves.Halve"
    assert result.config.env.name == name and result.config.rewards == []
    assert resolve_env(name) is Halve
    check_env(result.config.env)  # as the controller does before any role starts
