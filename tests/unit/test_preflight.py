"""One pre-flight (``controller.preflight``; issue 52, item 8): ``streamrl validate`` refuses
what ``streamrl launch`` refuses, with the same one line and exit status, before anything is
written. Before, the checks were written twice and ``validate`` passed a held-out split that
the launch refused (``eval_prompts`` ran in ``Controller.run`` only).

Both commands run in this process through ``cli.main``; the launch cannot start a role here
(``init_ray`` raises), so a config the pre-flight passed by mistake fails loudly instead of
training."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streamrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.yaml")


def _dataset_without_test_split(tmp_path: Path) -> list[str]:
    """A saved DatasetDict with a train split only, evaluated on data.eval_split=test."""
    import datasets

    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(16)]
    path = tmp_path / "gsm"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
    mapping = ["data.prompt_template={question}", "data.answer_key=answer"]
    return [f"data.source={path}", "data.eval_split=test", "eval.every=1", *mapping]


def _taken_run_directory(tmp_path: Path) -> list[str]:
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "config.yaml").write_text("{}")
    return ["run.name=taken"]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


# (how to make the bad config here, exit status, what its one line says)
BAD: dict[str, tuple[Callable[[Path], list[str]], int, str]] = {
    "held-out split": (_dataset_without_test_split, 2, "no split 'test'"),
    "missing data file": (
        lambda _: ["data.source=/no/such/prompts.parquet"],
        2,
        "prompt file not found",
    ),
    "unknown reward": (lambda _: ["rewards=[{name: no_such_reward}]"], 2, "unknown reward"),
    "bad engine option": (
        lambda _: ["generator.engine_options={nope: 1}"],
        2,
        "generator.engine_options.nope",
    ),
    "unknown environment": (
        lambda _: ["env.name=no_such_env", "rewards=[]"],
        2,
        "unknown env.name 'no_such_env'",
    ),
    "missing model": (lambda _: ["model.name=/no/such/model"], 2, "'/no/such/model' not found"),
    "missing reward model": (
        lambda _: ["rewards=[{model: /no/such/rm}]"],
        2,
        "'/no/such/rm' not found",
    ),
    "missing adapter": (lambda _: ["model.adapter=/no/such/adapter"], 2, "adapter_config.json"),
    "run directory taken": (_taken_run_directory, 1, "already exists"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_validate_and_launch_refuse_alike(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    make, code, message = BAD[case]
    args = [TINY, f"run.output_dir={tmp_path / 'runs'}", *make(tmp_path)]
    before = sorted(tmp_path.rglob("*"))
    capsys.readouterr()  # what making the case printed (a dataset's progress bars)

    def no_roles(address: str | None) -> None:
        raise AssertionError(f"the launch passed its pre-flight on a bad config ({case})")

    monkeypatch.setattr("streamrl.controller.run.init_ray", no_roles)
    validated = main(["validate", *args])
    said = capsys.readouterr().err.strip().splitlines()
    launched = main(["launch", *args])
    # The launch may first build the built-in model (its progress bar on stderr).
    refused = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("streamrl: ")
    ]
    assert len(said) == 1 and message in said[0] and said[0].startswith("streamrl: "), said
    assert refused == said
    assert validated == launched == code
    assert sorted(tmp_path.rglob("*")) == before, "nothing is written for a run that cannot start"


def test_a_taken_admin_port_is_refused_alike(
    taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = [TINY, f"run.output_dir={tmp_path}", f"admin.port={taken_port}"]
    assert main(["validate", *args]) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert main(["launch", *args]) == 1
    assert [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("streamrl: ")
    ] == said
    assert len(said) == 1 and f"127.0.0.1:{taken_port}" in said[0]


def test_validate_builds_no_model_and_the_launch_resolves_it(tmp_path: Path) -> None:
    """``resolve=False`` (validate) leaves a built-in unbuilt; the launch's pre-flight hands
    the controller the model's directory and everything else it found."""
    from streamrl.config import load_config
    from streamrl.controller.preflight import preflight

    config = load_config(TINY, [f"run.output_dir={tmp_path}"])
    assert preflight(config, resolve=False).model_dir is None
    checked = preflight(config, available_cores=[0, 1])
    assert checked.model_dir is not None and (checked.model_dir / "config.json").is_file()
    assert (checked.scorer_dirs, checked.cores) == ({}, {})
    assert not any(tmp_path.iterdir())
