"""The Python API's parts without a run: how ``streamrl.train`` reads its arguments into a config,
the ``python:`` callables table and how a generator gets it, and the console in a notebook."""

from __future__ import annotations

import builtins
import io
from pathlib import Path

import msgspec
import pytest

from streamrl import api, callables
from streamrl.config import ConfigError, load_config
from streamrl.plugins import load_named


def _closure(value: float):
    def reward(sample) -> float:
        return value

    return reward


def test_a_mapping_config_is_a_yaml_files_contents() -> None:
    config = api._load(
        {"run": {"max_steps": 3, "name": "n"}, "learner.lr": 2e-5, "data": {"args": {}}},
        ["model.name=tiny-random-llama"],
        ["run.max_steps=4"],
    )
    assert (config.run.max_steps, config.run.name, config.learner.lr) == (4, "n", 2e-5)
    assert config.model.name == "tiny-random-llama"
    # A Config goes through the same reading and comes back equal.
    assert api._load(config, [], []) == config
    # Python values never go through text: a string stays one, whatever YAML would make of it.
    assert api._override("data.system_prompt", "5") == ("data.system_prompt", "5")
    assert api._override("rewards", [{"name": "python:f"}]) == ("rewards", [{"name": "python:f"}])
    assert api._load({"data": {"system_prompt": "5", "answer_pattern": "#### (.+)"}}, [], [])
    config = api._load({"data": {"system_prompt": "null", "answer_pattern": "#### (.+)"}}, [], [])
    assert (config.data.system_prompt, config.data.answer_pattern) == ("null", "#### (.+)")
    with pytest.raises(ConfigError, match="unknown key `learner.lrr`"):
        api._load({"learner": {"lrr": 1}}, [], [])
    with pytest.raises(ConfigError, match="expected a YAML path"):
        api._load(3, [], [])  # type: ignore[arg-type]


def test_reward_arguments() -> None:
    fn = _closure(1.0)
    assert api._reward_parts(0, fn) == (fn, 1.0, {}, {})
    assert api._reward_parts(1, "numeric_match") == ("numeric_match", 1.0, {}, {})
    assert api._reward_parts(2, ("numeric_close", 0.5)) == ("numeric_close", 0.5, {}, {})
    assert api._reward_parts(3, ("numeric_close", 0.5, {"scale": 5})) == (
        "numeric_close",
        0.5,
        {"scale": 5},
        {},
    )
    assert api._reward_parts(4, {"name": "x:y", "weight": 2}) == ("x:y", 2.0, {}, {})
    assert api._reward_parts(5, {"name": "x:y", "normalize": "group", "label": "xy"}) == (
        "x:y",
        1.0,
        {},
        {"normalize": "group", "label": "xy"},
    )
    for bad, why in (
        (3, "rewards\\[0\\]: expected a callable"),
        (("numeric_match", "heavy"), "weight must be a number"),
        (("numeric_match", 1.0, ["scale"]), "args must be a mapping"),
        ((fn, 1, {}, "extra"), "expected \\(name_or_callable"),
        ({"fn": fn}, "expected the keys name, weight, args"),
    ):
        with pytest.raises(ConfigError, match=why):
            api._reward_parts(0, bad)


def test_served_rewards_keep_their_place_among_the_rules() -> None:
    served = {"model": "runs/rm", "weight": 0.5, "normalize": "running"}
    items = ["numeric_match", served, ("numeric_close", 0.5)]
    rules = [{"name": "numeric_match"}, {"name": "numeric_close"}]
    assert api._is_served(served) and not api._is_served("numeric_match")
    assert api._in_given_order(items, rules, [served]) == [rules[0], served, rules[1]]
    assert api._is_served({"teacher": {"model": "runs/teacher"}, "weight": 1.0})


def test_callables_get_stable_unique_names_and_resolve_by_them() -> None:
    first, second = _closure(1.0), _closure(2.0)
    names = callables.register([("reward", first), ("reward", first), ("reward", second)])
    assert names == {
        id(first): "python:test_train_api._closure.reward",
        id(second): "python:test_train_api._closure.reward-2",
    }
    assert load_named(names[id(second)], "reward") is second
    # A later call takes the name over: a notebook cell run again runs its new function.
    third = _closure(3.0)
    assert callables.register([("reward", third)]) == {id(third): names[id(first)]}
    assert load_named(names[id(first)], "reward") is third
    with pytest.raises(ConfigError, match="reward 'python:nowhere' is not registered"):
        load_named("python:nowhere", "reward")


def test_the_spec_factory_sends_what_the_config_names_and_a_generator_installs_it(
    tmp_path: Path,
) -> None:
    from streamrl.controller.specs import SpecFactory
    from streamrl.role_specs import GeneratorSpec

    fn = _closure(7.0)
    name = callables.register([("reward", fn)])[id(fn)]
    config = load_config(None, [f"rewards=[{{name: '{name}'}}]", "eval.check=numeric_match"])
    assert callables.referenced(config) == [name]
    spec = SpecFactory(config, tmp_path, str(tmp_path), "127.0.0.1").generator(0, 0)
    assert list(spec.callables) == [name]
    # As Ray would carry it; then the generator's first step, in a process without the table.
    spec = msgspec.msgpack.decode(msgspec.msgpack.encode(spec), type=GeneratorSpec)
    callables._OBJECTS.pop(name)
    callables.install(spec.callables)
    assert load_named(name, "reward")(None) == 7.0
    # A python: name this process never registered fails the factory in one line.
    missing = load_config(None, ["rewards=[{name: 'python:gone'}]"])
    with pytest.raises(ConfigError, match="'python:gone' is not registered"):
        SpecFactory(missing, tmp_path, str(tmp_path), "127.0.0.1")


def test_step_lines_reach_a_notebooks_output(tmp_path: Path, monkeypatch) -> None:
    """Under IPython's kernel rich writes through IPython's display and draws its bar as a
    widget from a thread; the console gets the plain lines instead (no IPython here: rich
    would fail to import it)."""
    from streamrl.metrics import MetricsLog

    class ZMQInteractiveShell:  # what rich looks for: the notebook kernel's shell
        pass

    monkeypatch.setattr(builtins, "get_ipython", ZMQInteractiveShell, raising=False)
    out = io.StringIO()
    config = load_config(None, ["logging.progress=true"])
    log = MetricsLog(tmp_path / "metrics.jsonl", out, config)
    assert log.progress is None
    log.write({"step": 1, "reward/mean": 0.5})
    log.eval(0, 1, {"eval/exact_match": 0.25})
    log.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step    1 | reward 0.500") and lines[1].startswith("eval v  1")


def test_data_source_arguments(tmp_path: Path, monkeypatch) -> None:
    import datasets

    monkeypatch.chdir(tmp_path)
    (tmp_path / "arithmetic").mkdir()  # a directory named like a task: the task still wins
    (tmp_path / "rows.jsonl").write_text("{}\n")
    assert api._source_text("arithmetic") == "arithmetic"
    assert api._source_text(Path("rows.jsonl")) == str(tmp_path / "rows.jsonl")
    assert api._source_text("owner/name") == "owner/name"  # a hub id, not a path here
    table = datasets.Dataset.from_list([{"prompt": "What is 1 + 1?", "answer": "2"}])
    with pytest.raises(ConfigError, match="dataset= and a data.source override"):
        api.train(dataset=table, config={}, overrides=["data.source=arithmetic"])
    with pytest.raises(ConfigError, match="expected a datasets.Dataset or DatasetDict"):
        api.train(dataset=3, config={})
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_a_list_of_dicts_or_a_dict_of_columns_is_a_dataset(tmp_path: Path, monkeypatch) -> None:
    """``streamrl.train(dataset=[{...}, ...])`` was refused ("expected a datasets.Dataset");
    rows as dicts, or a table's columns as a dict, are made a ``Dataset`` at the door and
    staged as one. Anything else in a list is refused in one line before anything is
    written."""
    import datasets

    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(4)]
    columns = {key: [row[key] for row in rows] for key in ("question", "answer")}
    assert api.as_dataset(rows).to_list() == rows
    assert api.as_dataset(columns).to_list() == rows
    table = datasets.Dataset.from_list(rows)
    assert api.as_dataset(table) is table and api.as_dataset("arithmetic") == "arithmetic"
    launched = {}

    def launch(cfg, address, console, staged):  # the run, without running it
        launched.update(cfg=cfg, rows=datasets.load_from_disk(str(staged)).to_list())
        (staged.parent / "summary.json").write_text("{}")
        return {"run_dir": str(staged.parent)}

    monkeypatch.setattr(api, "_launch", launch)
    config = {
        "run": {"output_dir": str(tmp_path), "name": "r"},
        "data": {"prompt_template": "{question}", "answer_key": "answer"},
    }
    result = api.train(dataset=rows, config=config)
    assert launched["rows"] == rows
    assert launched["cfg"].data.source == str((tmp_path / "r" / "dataset").resolve())
    assert result.run_dir == tmp_path / "r"
    config["run"]["name"] = "refused"
    for bad, message in [
        ([rows[0], "What is 2 + 2?"], "item 1 is a str"),
        ([], "the list is empty"),
        ({"question": ["a"], "answer": "b"}, "column 'answer' is a str"),
        ({"question": ["a", "b"], "answer": ["c"]}, "the columns differ in length"),
        ([{"question": "a"}, {"question": 1}], "do not make one table"),
    ]:
        with pytest.raises(ConfigError, match=message) as info:
            api.train(dataset=bad, config=config)
        assert "\n" not in str(info.value)
    assert not (tmp_path / "refused").exists()


def test_a_staged_dataset_does_not_make_the_run_directory_taken(tmp_path: Path) -> None:
    from streamrl.controller.rundir import RunError, check_run_dir, prepare_run_dir

    base = [f"run.output_dir={tmp_path}", "run.name=r"]
    (tmp_path / "r" / "dataset").mkdir(parents=True)  # what streamrl.train writes first
    run_dir = prepare_run_dir(load_config(None, base))
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.yaml",
        "data_pin.json",
        "dataset",
        "logs",
    ]
    with pytest.raises(RunError, match="already exists"):
        check_run_dir(load_config(None, base))
    # run.overwrite removes the earlier run's files, and keeps the dataset staged for this one.
    prepare_run_dir(load_config(None, [*base, "run.overwrite=true"]))
    assert (run_dir / "dataset").is_dir() and (run_dir / "config.yaml").is_file()
