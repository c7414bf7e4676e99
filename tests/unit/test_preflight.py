"""One pre-flight (``controller.preflight``; issue 52, item 8): ``streamrl validate`` refuses
what ``streamrl launch`` refuses, with the same one line and exit status, before anything is
written. Before, the checks were written twice and ``validate`` passed a held-out split that
the launch refused (``eval_prompts`` ran in ``Controller.run`` only).

Both commands run in this process through ``cli.main``; the launch cannot start a role here
(``init_ray`` raises), so a config the pre-flight passed by mistake fails loudly instead of
training. One case also runs through the installed ``streamrl`` command, each command in a
process of its own.

What ``validate`` leaves to the launch, by design (``controller.preflight``'s module doc):
the two checks that need a built-in model's weights (the engine serving it, a LoRA target
in it), since ``validate`` builds no model and imports no torch (``LEFT_TO_THE_LAUNCH``)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
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


def _held_out_rows_that_are_trained_on(tmp_path: Path) -> list[str]:
    """eval.source shares four of its five questions with data.source."""
    rows = [{"prompt": f"What is {i} + 1?", "ground_truth": str(i + 1)} for i in range(16)]
    held = [*rows[10:14], {"prompt": "What is 99 + 1?", "ground_truth": "100"}]
    for name, part in (("train.jsonl", rows), ("held.jsonl", held)):
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in part))
    return [
        f"data.source={tmp_path / 'train.jsonl'}",
        f"eval.source={tmp_path / 'held.jsonl'}",
        "eval.every=1",
    ]


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
    "unknown key": (lambda _: ["learner.no_such_knob=1"], 2, "unknown key `learner.no_such_knob`"),
    "out-of-range value": (lambda _: ["learner.lr=-1"], 2, "learner.lr must be > 0"),
    "held-out split": (_dataset_without_test_split, 2, "no split 'test'"),
    "held-out rows trained on": (
        _held_out_rows_that_are_trained_on,
        2,
        "4 of 5 held-out rows",
    ),
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
    # Before: `validate` passed a bare name (check_model leaves those to the launch).
    "unknown model name": (
        lambda _: ["model.name=smollm3-135m"],
        2,
        "'smollm3-135m' not found",
    ),
    "unknown tiny architecture": (
        lambda _: ["model.name=tiny-random-gpt9"],
        2,
        "'tiny-random-gpt9' is not a tiny random model",
    ),
    "unknown reward model name": (
        lambda _: ["rewards=[{model: no-such-rm}]"],
        2,
        "'no-such-rm' not found",
    ),
    "missing reward model": (
        lambda _: ["rewards=[{model: /no/such/rm}]"],
        2,
        "'/no/such/rm' not found",
    ),
    "missing adapter": (lambda _: ["model.adapter=/no/such/adapter"], 2, "adapter_config.json"),
    # Before: `validate` of a built-in left the engine to the launch, installed or not. SGLang
    # is not installed here; where it is, it refuses a CPU device: one line naming it either way.
    "an engine this machine cannot run": (
        lambda _: ["generator.engine=sglang", "generator.device=cpu"],
        2,
        "engine=sglang",
    ),
    "run directory taken": (_taken_run_directory, 1, "already exists"),
    "more cores than there are": (
        lambda _: ["placement.pin_cpus=true", "placement.learner_cores=4096"],
        1,
        "placement.learner_cores=4096 leaves no core for the generators",
    ),
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


def test_the_commands_refuse_alike_as_processes(tmp_path: Path) -> None:
    """The installed ``streamrl`` command, ``validate`` and ``launch`` each in a process of
    its own: the same exit status and one line (the launch refuses before Ray starts)."""
    streamrl = Path(sys.executable).with_name("streamrl")
    args = [TINY, f"run.output_dir={tmp_path}", "model.name=smollm3-135m"]
    done = [
        subprocess.run(
            [str(streamrl), command, *args], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        for command in ("validate", "launch")
    ]
    lines = [[x for x in d.stderr.splitlines() if x.startswith("streamrl: ")] for d in done]
    assert [d.returncode for d in done] == [2, 2], [d.stderr for d in done]
    assert lines[0] == lines[1] and len(lines[0]) == 1 and "not found" in lines[0][0]
    assert not any(tmp_path.iterdir())


# What the launch refuses and `validate` passes (module doc): the model's weights are needed.
LEFT_TO_THE_LAUNCH: dict[str, tuple[list[str], str]] = {
    "vLLM and a MoE's fused experts": (
        ["model.name=tiny-random-qwen3-moe", "generator.engine=vllm"],
        "cannot take streamed weights",
    ),
    "a LoRA target the model lacks": (
        ["model.lora={r: 4, alpha: 8, target_modules: [no_such_proj]}"],
        "model.lora.target_modules",
    ),
}


@pytest.mark.parametrize("case", list(LEFT_TO_THE_LAUNCH))
def test_what_validate_leaves_to_the_launch(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``validate`` of a built-in builds no model and imports no torch, so these two pass it;
    the launch builds the model first and refuses them in one line, exit 2."""
    overrides, message = LEFT_TO_THE_LAUNCH[case]
    if "generator.engine=vllm" in overrides:
        pytest.importorskip("vllm")
    args = [TINY, f"run.output_dir={tmp_path}", *overrides]

    def no_roles(address: str | None) -> None:
        raise AssertionError(f"the launch passed its pre-flight on a bad config ({case})")

    monkeypatch.setattr("streamrl.controller.run.init_ray", no_roles)
    assert main(["validate", *args]) == 0
    capsys.readouterr()
    assert main(["launch", *args]) == 2
    refused = [x for x in capsys.readouterr().err.splitlines() if x.startswith("streamrl: ")]
    assert len(refused) == 1 and message in refused[0], refused


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
