"""What the model answered (``streamrl.eval_answers``): which responses an evaluation keeps,
how they travel in an ``EvalReport``, the run directory's file and ``streamrl answers``."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from streamrl.cli import main
from streamrl.eval_answers import ANSWERS_FILE, AnswersLog, format_answers, keep, read_answers
from streamrl.protocol import EvalReport, Report


def _samples(prompts: int, per_prompt: int) -> list[dict]:
    return [
        {
            "prompt_id": f"e{p}",
            "response": f"answer {p}.{s}",
            "ground_truth": str(p),
            "reward": float(s == 0),
            "exact": s == 0,
            "stopped": True,
        }
        for p in range(prompts)
        for s in range(per_prompt)
    ]


def test_the_first_prompts_are_kept_with_all_their_samples_and_scores() -> None:
    asked: list[int] = []

    def questions() -> dict[str, str]:
        asked.append(1)
        return {f"e{p}": f"question {p}" for p in range(5)}

    served = {2: [0.5, None, 0.7, 0.8, 0.9, 1.0]}
    kept = keep(_samples(3, 2), questions, served, lambda r: f"rm{r}", 2)
    assert [(a.prompt_id, a.response) for a in kept] == [
        ("e0", "answer 0.0"),
        ("e0", "answer 0.1"),
        ("e1", "answer 1.0"),
        ("e1", "answer 1.1"),
    ]
    assert [a.question for a in kept] == ["question 0"] * 2 + ["question 1"] * 2
    assert [a.served for a in kept] == [{"rm2": 0.5}, {"rm2": None}, {"rm2": 0.7}, {"rm2": 0.8}]
    assert [a.exact for a in kept] == [True, False, True, False]
    # Nothing kept: the held-out set is not even read for its questions.
    assert keep(_samples(3, 2), questions, served, str, 0) == [] and len(asked) == 1


def test_answers_travel_in_the_report_and_land_in_the_run_directory(tmp_path: Path) -> None:
    kept = keep(_samples(2, 1), lambda: {"e0": "2+2?"}, {}, str, 16)
    report = EvalReport(0, 10, 11, {"eval/accuracy": 0.5}, 1.0, weights_epoch=1, answers=kept)
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(report), type=Report)
    assert wire == report
    old = EvalReport(0, 5, 5, {}, 1.0)  # a report of a generator that keeps none
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=Report).answers == []

    log = AnswersLog(tmp_path)
    assert log.append(old) == [] and not (tmp_path / ANSWERS_FILE).exists()
    rows = log.append(wire)
    assert [(r["version"], r["requested"], r["epoch"]) for r in rows] == [(11, 10, 1)] * 2
    with (tmp_path / ANSWERS_FILE).open("a") as f:
        f.write('{"version": 12, "prom')  # a run killed mid-write
    assert list(read_answers(tmp_path)) == rows
    assert rows[0]["question"] == "2+2?" and rows[1]["question"] == ""


def test_streamrl_answers_prints_each_prompt_across_versions(
    tmp_path: Path, capsys: object
) -> None:
    log = AnswersLog(tmp_path)
    for version, response in ((0, "5"), (10, "4")):
        kept = keep(_samples(1, 1), lambda: {"e0": "What is 2 + 2?"}, {}, str, 1)
        kept[0].response, kept[0].exact = response, response == "4"
        log.append(EvalReport(0, version, version, {}, 1.0, answers=kept))
    lines = format_answers(list(read_answers(tmp_path)))
    assert lines[0].startswith("e0: What is 2 + 2?")
    assert "v   0  wrong" in lines[1] and lines[1].endswith("| 5")
    assert "v  10  exact" in lines[2] and lines[2].endswith("| 4")

    assert main(["answers", str(tmp_path), "--version", "10"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "v  10" in out and "v   0" not in out
    assert main(["answers", str(tmp_path), "--prompt", "nope"]) == 1
    assert main(["answers", str(tmp_path / "missing")]) == 2
    assert "no answers.jsonl" in capsys.readouterr().err  # type: ignore[attr-defined]
    assert json.loads((tmp_path / ANSWERS_FILE).read_text().splitlines()[0])["response"] == "5"
