"""What a user types as ``section.key=value`` is what the run gets (issue 52, item 7;
``config.parse_overrides``): a string key takes the text as typed, other keys read it as YAML,
and text YAML cannot read for its key's type is refused in one line with a hint.

Before, every value was read as YAML: the README's GSM8K mapping typed as overrides failed
(``data.prompt_template=Question: {question}``: "Expected `str`, got `object`", a colon made
a mapping; ``data.answer_pattern=#### (.+)``: "got `null`", ``#`` began a comment)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from streamrl.cli import main
from streamrl.config import ConfigError, load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.yaml")


def readme_data_mapping() -> dict[str, str]:
    """The ``data:`` section of README.md's own-data YAML job (the GSM8K mapping)."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- snippet: own-data-yaml\b.*?-->\s*```yaml\n(.*?)```", text, re.S)
    assert match, "README.md has no own-data-yaml snippet"
    data = yaml.safe_load(match.group(1))["data"]
    assert {"prompt_template", "answer_pattern"} <= set(data)
    return data


def gsm8k_overrides(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The README's mapping as command-line overrides over a GSM8K-layout JSONL here, and the
    values the run must get; plus the issue's own spelling of the template."""
    rows = [{"question": f"Tom has {i} cards.", "answer": f"So #### {i}"} for i in range(16)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    wanted = {**readme_data_mapping(), "source": str(path)}
    overrides = [f"data.{key}={value}" for key, value in wanted.items()]
    return overrides, wanted


def test_the_readmes_gsm8k_mapping_typed_as_overrides_is_what_the_run_gets(
    tmp_path: Path,
) -> None:
    overrides, wanted = gsm8k_overrides(tmp_path)
    data = load_config(TINY, overrides).data
    assert {key: getattr(data, key) for key in wanted} == wanted
    issue = ["data.prompt_template=Question: {question}", "data.answer_pattern=#### (.+)"]
    data = load_config(TINY, [*overrides, *issue]).data
    assert (data.prompt_template, data.answer_pattern) == ("Question: {question}", "#### (.+)")


def test_the_cli_validates_the_readmes_mapping_typed_as_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides, wanted = gsm8k_overrides(tmp_path)
    code = main(["validate", TINY, f"run.output_dir={tmp_path}", *overrides])
    out = capsys.readouterr()
    assert code == 0, out.err
    resolved = yaml.safe_load(out.out)["data"]
    assert {key: resolved[key] for key in wanted} == wanted


@pytest.mark.parametrize(
    ("override", "value"),
    [
        # str keys: the text as typed, whatever YAML would make of it.
        ("data.answer_pattern=#### (.+)", "#### (.+)"),
        ("data.prompt_template=Question: {question}", "Question: {question}"),
        ("run.name=2024", "2024"),
        ("data.source=[not, a, list]", "[not, a, list]"),
        ("run.mode=sync", "sync"),  # a Literal of strings
        # Text wholly in one pair of quotes is the string quoted, as when every value was
        # YAML; quotes inside the text are the text's.
        ("data.answer_pattern='####\\s*(.+)'", "####\\s*(.+)"),
        ('eval.unseen_phrasing=""', ""),
        ("run.name='1e-4'", "1e-4"),
        ("data.prompt_template='{a}' or '{b}'", "'{a}' or '{b}'"),
        ("data.system_prompt='null'", "null"),
        # str | None: a null word is None, anything else is the text.
        ("data.system_prompt=null", None),
        ("model.revision=~", None),
        ("data.system_prompt=5", "5"),
        ("data.system_prompt=Be brief: answer # then stop", "Be brief: answer # then stop"),
        # list[str] | str: a bracketed list is the list.
        ("model.lora.target_modules=[q_proj, v_proj]", ["q_proj", "v_proj"]),
        ("model.lora.target_modules=.*proj", ".*proj"),
        # other types: YAML.
        ("learner.lr=1e-4", 1e-4),
        ("generator.count=3", 3),
        ("generator.in_flight_updates=false", False),
        ("eval.max_new_tokens=null", None),
        ("rewards=[{name: numeric_match, weight: 2}]", [{"name": "numeric_match", "weight": 2}]),
        # a value of any type (a task's args): YAML's scalars and bracketed collections,
        # else the text.
        ("data.args.max_operand=50", 50),
        ("data.args.operations=[+, -]", ["+", "-"]),
        ("data.args.question_template=Q: {a} {op} {b}?", "Q: {a} {op} {b}?"),
    ],
)
def test_each_key_reads_the_text_for_its_type(override: str, value: object) -> None:
    ((key, parsed),) = parse_overrides([override])
    assert parsed == value and type(parsed) is type(value)
    if key.startswith("model.lora."):
        return  # a section only present with LoRA: load_config checks more than the type
    node = load_config(None, [override])
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    assert node == value or [r.name for r in node] == ["numeric_match"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.max_new_tokens=12 # tokens", "eval.max_new_tokens takes YAML, where ' #' starts"),
        ("rewards=[{name: numeric_match}", "rewards takes YAML: while parsing a flow sequence"),
        ("learner.lr=fast", "at `learner.lr` (set by the override 'learner.lr=fast')"),
    ],
)
def test_a_value_that_is_not_its_keys_type_is_one_line_with_a_hint(
    override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert message in str(info.value) and "\n" not in str(info.value)
    assert main(["validate", TINY, override]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"streamrl: {info.value}"


def test_typed_pairs_are_taken_as_they_are() -> None:
    """``streamrl.train`` and ``--resume`` pass Python values, which never go through text."""
    config = load_config(None, [("run.name", "null"), ("data.system_prompt", "#x"), "run.seed=3"])
    assert (config.run.name, config.data.system_prompt, config.run.seed) == ("null", "#x", 3)
    with pytest.raises(ConfigError, match="expected section.key=value"):
        parse_overrides([("", 1)])


def test_a_new_user_s_command_line_over_the_default_job_reads_their_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``streamrl validate data.source=train.jsonl ... rewards=[gsm8k]``, as ``launch`` takes
    it: no config file (the default job's), the default task's ``data.args`` left behind with
    its source, a bare reward name is a rule, and the row counts of each side are said."""
    overrides, wanted = gsm8k_overrides(tmp_path)
    held = [{"question": f"Ann has {i} pens.", "answer": f"So #### {i}"} for i in range(8)]
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps(row) + "\n" for row in held))
    line = [
        f"run.output_dir={tmp_path}",
        *overrides,
        f"eval.source={test}",
        "rewards=[gsm8k]",
        "eval.check=gsm8k",
    ]
    code = main(["validate", *line])
    out = capsys.readouterr()
    assert code == 0, out.err
    resolved = yaml.safe_load(out.out)
    assert resolved["data"]["args"] == {} and resolved["rewards"][0]["name"] == "gsm8k"
    assert "data: 16 training rows, 8 held-out rows (disjoint by question)" in out.err
    # Named with the source, the task's arguments stay the user's to set.
    with pytest.raises(ConfigError, match="data.args is for a built-in task"):
        from streamrl.controller.preflight import preflight

        preflight(load_config(None, [*line, "data.args={max_operand: 5}"]), resolve=False)


def test_plus_equals_appends_to_a_list_and_refuses_a_scalar() -> None:
    """``rewards+=[...]`` adds a reward (a teacher beside the job's rules) without restating
    the list; ``+=`` on a field that is not a list is one line."""
    default = load_config("configs/default.yaml")
    config = load_config(
        "configs/default.yaml", ["rewards+=[{teacher: {model: runs/t, top_k: 8}}]"]
    )
    assert [r.display_name() for r in config.rewards] == [
        *(r.display_name() for r in default.rewards),
        "teacher-t",
    ]
    assert config.rewards[-1].teacher.top_k == 8
    with pytest.raises(ConfigError, match=r"\+= adds a list to a list"):
        load_config("configs/default.yaml", ["learner.lr+=[1]"])
