"""A resumed run is pinned to its data (``controller.rundir.check_resume_pinned``; issue 52):
the run directory records ``run.seed``, the ``data`` section and the training rows' count and
digest at the first launch, and a ``--resume`` on anything else is refused in one line naming
what differs; the same data resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_heldout_disjoint import gsm_config
from test_tables import gsm_rows, write_jsonl

from streamrl.config import load_config
from streamrl.controller.rundir import DATA_PIN, RunError, check_resume_pinned, prepare_run_dir


def launched(tmp_path: Path, source: str, *extra: str):
    """The config of a first launch into ``tmp_path/runs/pinned``, its run directory made."""
    config = gsm_config(source, f"run.output_dir={tmp_path / 'runs'}", "run.name=pinned", *extra)
    check_resume_pinned(config)  # a new run is never refused here
    return prepare_run_dir(config)


def resumed(tmp_path: Path, source: str, *extra: str):
    """What ``streamrl launch --resume runs/pinned`` with ``extra`` as overrides runs."""
    return gsm_config(
        source, f"run.output_dir={tmp_path / 'runs'}", "run.name=pinned", "run.resume=true", *extra
    )


def refusal(config) -> str:
    with pytest.raises(RunError) as info:
        check_resume_pinned(config)
    message = str(info.value)
    assert "\n" not in message and "without --resume" in message
    return message


def test_a_resume_on_the_same_data_goes_on_and_other_data_is_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(80))
    run_dir = launched(tmp_path, str(path))
    pin = json.loads((run_dir / DATA_PIN).read_text())
    assert pin["seed"] == 0 and pin["data"]["source"] == str(path.resolve())
    assert pin["table"]["rows"] > 60 and pin["table"]["digest"]

    check_resume_pinned(resumed(tmp_path, str(path)))
    check_resume_pinned(resumed(tmp_path, str(path), "run.max_steps=500"))  # not data
    check_resume_pinned(resumed(tmp_path, str(path), "data.sampler=difficulty"))  # how drawn

    message = refusal(resumed(tmp_path, str(path), "data.max_rows=40"))
    assert "data.max_rows is 40, the run started with 0" in message
    message = refusal(resumed(tmp_path, str(path), "run.seed=2"))
    assert message.startswith("--resume: run.seed is 2, the run started with 0")

    # Same settings, other rows: the file edited since the first launch.
    write_jsonl(path, gsm_rows(81)[1:])
    message = refusal(resumed(tmp_path, str(path)))
    assert f"the training rows of data.source {path} changed" in message
    write_jsonl(path, gsm_rows(80))  # put back: the run's data again
    check_resume_pinned(resumed(tmp_path, str(path)))


def test_the_data_file_spelled_another_way_is_the_same_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(24))
    monkeypatch.chdir(tmp_path)
    launched(tmp_path, "./gsm.jsonl")
    check_resume_pinned(resumed(tmp_path, str(path)))
    other = write_jsonl(tmp_path / "other.jsonl", gsm_rows(24))
    assert "data.source" in refusal(resumed(tmp_path, str(other)))


def test_a_generated_task_is_pinned_by_its_settings_and_seed(tmp_path: Path) -> None:
    run = [f"run.output_dir={tmp_path}", "run.name=task"]
    prepare_run_dir(load_config(None, run))
    check_resume_pinned(load_config(None, [*run, "run.resume=true"]))
    message = refusal(load_config(None, [*run, "run.resume=true", "data.args.max_operand=7"]))
    assert "data.args is {'max_operand': 7}" in message


def test_a_run_directory_from_before_the_pin_resumes_and_is_pinned_then(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(24))
    run_dir = launched(tmp_path, str(path))
    (run_dir / DATA_PIN).unlink()
    config = resumed(tmp_path, str(path), "data.max_rows=10")
    check_resume_pinned(config)  # nothing to hold it to (a warning)
    prepare_run_dir(config)
    assert json.loads((run_dir / DATA_PIN).read_text())["data"]["max_rows"] == 10
    assert "data.max_rows is 0" in refusal(resumed(tmp_path, str(path)))
