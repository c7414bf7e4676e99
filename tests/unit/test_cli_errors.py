"""Bad input to `streamrl launch` fails with one clear line before any process starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "launch",
            "configs/tiny.yaml",
            f"run.output_dir={tmp_path}",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["model.name=/no/such/model"], 2, "model '/no/such/model' not found"),
        (["data.source=/no/such/prompts.parquet"], 2, "prompt file not found"),
        (["rewards=[{name: no_such_reward}]"], 2, "unknown reward"),
        (["generator.count=zero"], 2, "generator.count"),
        (["model.lora={target_modules: [nope]}"], 2, "target_modules"),
        (["model.adapter=/no/such/adapter"], 2, "adapter_config.json"),
        # An engine that cannot serve the model (vLLM: heads of 16 have no CPU kernel).
        (["generator.engine=vllm"], 2, "generator.engine"),
        (["--learners", "3"], 2, "divisible"),
    ],
)
def test_one_line_errors(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    result = _launch(tmp_path, *args)
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not any(tmp_path.iterdir()), "nothing is written for a run that cannot start"


def test_used_run_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.yaml").write_text("{}")
    result = _launch(tmp_path, "--name", "taken")
    assert result.returncode == 1
    assert "already exists" in result.stderr.strip().splitlines()[-1]


def test_admin_port_in_use_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = _launch(tmp_path, f"admin.port={port}")
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], result.stderr
    assert not any(tmp_path.iterdir())


def test_overrides_after_flags_join_the_overrides_and_a_stray_flag_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`streamrl launch` and `streamrl bench throughput` alike (``parse_with_overrides``)."""
    from streamrl.bench.cli import _parser as bench_parser
    from streamrl.config.overrides import parse_with_overrides

    args = parse_with_overrides(
        bench_parser(), ["throughput", "c.yaml", "a.b=1", "--steps", "3", "c.d=2"]
    )
    assert (args.config, args.overrides, args.steps) == ("c.yaml", ["a.b=1", "c.d=2"], 3)
    with pytest.raises(SystemExit) as exit_:
        parse_with_overrides(bench_parser(), ["throughput", "c.yaml", "--steps", "3", "--bogus"])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1].endswith("unrecognized arguments: --bogus")
    )
