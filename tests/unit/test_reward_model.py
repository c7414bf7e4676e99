"""Sequence-classification reward models (``streamrl.rewards.model``,
``model_training``) on ``tiny-random-reward``:
the one text a (question, response) is scored as, scores that do not depend on the batch,
the weights' hash, refused inputs, Bradley-Terry training that learns a separable
preference, pairs made from a logged run, and ``streamrl rm``."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from streamrl.buffers.durable_log import DurableLog
from streamrl.cli import main
from streamrl.config import default_config_path, load_config, to_yaml
from streamrl.data import prompt_stream
from streamrl.models import load_tokenizer, resolve_model
from streamrl.protocol import Trajectory, TrajectoryGroup
from streamrl.rewards import RewardInput, numeric_match
from streamrl.rewards.model import (
    RewardModelScorer,
    load_reward_model,
    reward_ids,
    reward_text,
    weights_hash,
)
from streamrl.rewards.model_training import (
    Pair,
    pairs_from_run,
    read_pairs,
    split_by_question,
    train_reward_model,
    write_pairs,
)
from streamrl.rewards.scorer import ScoreItem

ROOT = Path(__file__).resolve().parents[2]
TINY_RM = "tiny-random-reward"


@pytest.fixture(scope="module")
def rm_dir() -> Path:
    return resolve_model(TINY_RM)


def digit_pairs(n: int, seed: int = 0) -> list[Pair]:
    """Chosen states the sum in digits, rejected a word where the number should be: a
    preference a 2-layer model can learn in seconds."""
    rng = random.Random(seed)
    words = ["many", "lots", "unknown", "a number", "some", "plenty", "it depends"]
    pairs = []
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        pairs.append(
            Pair(f"What is {a} + {b}?", f"{a} + {b} = {a + b}", f"{a} + {b} = {rng.choice(words)}")
        )
    return pairs


# --------------------------------------------------------------------------- text and scores


def test_reward_text_is_the_chat_template_or_plain_text(rm_dir: Path) -> None:
    tokenizer = load_tokenizer(rm_dir)
    assert reward_text(tokenizer, "What is 2 + 2?", "4") == (
        "<bos>user\nWhat is 2 + 2?<eos><bos>assistant\n4<eos>"
    )
    tokenizer.chat_template = None
    assert reward_text(tokenizer, "What is 2 + 2?", "4") == "What is 2 + 2?\n4\n"


def test_a_response_cut_at_the_token_limit_is_scored_without_an_end(rm_dir: Path) -> None:
    """stopped=False: the text ends where the policy's did, not with the template's
    end-of-turn marker, so a cut response and the same words ended score apart."""
    tokenizer = load_tokenizer(rm_dir)
    ended = reward_text(tokenizer, "What is 2 + 2?", "2 + 2 = 4")
    cut = reward_text(tokenizer, "What is 2 + 2?", "2 + 2 = 4", stopped=False)
    assert cut == "<bos>user\nWhat is 2 + 2?<eos><bos>assistant\n2 + 2 = 4"
    assert ended == cut + "<eos>"
    tokenizer.chat_template = None
    assert reward_text(tokenizer, "q", "4 4", stopped=False) == "q\n4 4"
    scorer = RewardModelScorer(rm_dir, "rm-tiny")
    items = [ScoreItem("What is 2 + 2?", "2 + 2 = 4", stopped=s) for s in (True, False)]
    first, second = scorer.score(items)
    assert first != second


def test_reward_ids_keep_the_end_of_a_long_text(rm_dir: Path) -> None:
    tokenizer = load_tokenizer(rm_dir)
    full = reward_ids(tokenizer, "x" * 300, "the answer is 7", 10_000)
    cut = reward_ids(tokenizer, "x" * 300, "the answer is 7", 64)
    assert len(full) > 300 and cut == full[-64:]
    assert tokenizer.decode(cut).endswith("the answer is 7<eos>")


def test_a_score_does_not_depend_on_its_batch(rm_dir: Path) -> None:
    """Right padding with the pad id the head reads: a batch of mixed lengths scores each
    item as a batch of one does (fp32, 1e-4), in the order given."""
    scorer = RewardModelScorer(rm_dir, "rm-tiny", batch_size=4)
    items = [
        ScoreItem(f"What is {i} + {i * 7}?", "x" * (3 * i) + f" {i * 8}", str(i * 8))
        for i in (5, 0, 9, 2, 7, 1, 8, 3, 6)
    ]
    batched = scorer.score(items)
    alone = [scorer.score([item])[0] for item in items]
    assert len({len(reward_ids(scorer.tokenizer, i.prompt, i.response, 1024)) for i in items}) > 4
    assert all(isinstance(s, float) for s in batched)
    assert max(abs(a - b) for a, b in zip(batched, alone, strict=True)) < 1e-4
    assert len({round(s, 6) for s in batched}) > 1  # not a constant head


def test_weights_hash_is_stable_and_follows_the_weights(rm_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "rm"
    shutil.copytree(rm_dir, copy)
    first = weights_hash(copy)
    assert len(first) == 12 and int(first, 16) >= 0
    assert weights_hash(copy) == first == weights_hash(rm_dir)
    scorer = RewardModelScorer(copy, "rm-tiny")
    assert scorer.identity == f"rm-tiny@{first}"

    tensors = load_file(copy / "model.safetensors")
    tensors["score.weight"] = tensors["score.weight"] + 1e-3
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    assert weights_hash(copy) != first
    (copy / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        weights_hash(copy)


def test_only_a_one_label_sequence_classifier_loads(rm_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load_reward_model(rm_dir)
    assert not model.training and model.config.pad_token_id == tokenizer.pad_token_id
    assert next(model.parameters()).dtype == torch.float32

    with pytest.raises(ValueError, match="is not a reward model .*LlamaForCausalLM"):
        load_reward_model(resolve_model("tiny-random-llama"))
    two = tmp_path / "two-labels"
    shutil.copytree(rm_dir, two)
    config = json.loads((two / "config.json").read_text())
    config["id2label"] = {"0": "bad", "1": "good"}
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has 1 label, this has 2"):
        load_reward_model(two)


# --------------------------------------------------------------------------- pairs files


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": "q",\n', ":2: not JSON"),
        ('\n["q", "a", "b"]\n', ":2: not a JSON object"),
        ('{"prompt": "q", "chosen": "a"}\n', ":1: rejected missing or not a string"),
        ('{"prompt": "q", "chosen": 7, "rejected": "b"}\n', ":1: chosen missing or not a string"),
        (
            '{"prompt": "q", "chosen": "a", "rejected": "a"}\n',
            ":1: chosen and rejected are the same",
        ),
        (
            '{"prompt": "q", "chosen": "a", "rejected": "b", "chosen_stopped": "no"}\n',
            ":1: chosen_stopped and rejected_stopped must be true or false",
        ),
        ("\n\n", ": no pairs in the file"),
        ("", ": no pairs in the file"),
    ],
)
def test_read_pairs_refuses_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError) as caught:
        read_pairs(path)
    assert f"{path}{message}" in str(caught.value) and "\n" not in str(caught.value)


def test_pairs_round_trip_and_a_missing_file(tmp_path: Path) -> None:
    pairs = [Pair("Wie viel ist 2 + 2? ✓", "4", "fünf"), Pair("q", 'say "hi"\n', "")]
    pairs.append(Pair("q", "4", "4", chosen_stopped=True, rejected_stopped=False))
    write_pairs(tmp_path / "p.jsonl", pairs)
    assert read_pairs(tmp_path / "p.jsonl") == pairs
    (tmp_path / "plain.jsonl").write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n')
    assert read_pairs(tmp_path / "plain.jsonl") == [Pair("q", "a", "b", True, True)]
    with pytest.raises(FileNotFoundError, match="pairs file not found"):
        read_pairs(tmp_path / "missing.jsonl")


# --------------------------------------------------------------------------- training


def test_bradley_terry_training_learns_a_held_out_preference(rm_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "rm"
    lines: list[str] = []
    figures = train_reward_model(
        digit_pairs(160), TINY_RM, out, epochs=2, lr=1e-3, held_out=0.25, log=lines.append
    )
    assert figures["pairs_train"] + figures["pairs_held_out"] == 160
    assert 40 <= figures["pairs_held_out"] <= 45  # whole questions: a few pairs over the 40
    questions = len({p.prompt for p in digit_pairs(160)})
    assert figures["questions_train"] + figures["questions_held_out"] == questions
    assert any(f"{figures['questions_held_out']} other questions held out" in x for x in lines)
    assert figures["accuracy_after"] >= 0.9 > figures["accuracy_before"]
    assert figures["train_loss"] < 0.3
    assert any("accuracy after" in line for line in lines)
    assert json.loads((out / "rm_train.json").read_text()) == figures
    assert set(figures) >= {"seconds", "lr", "epochs", "cpu_capability", "base"}

    scorer = RewardModelScorer(out, "rm-trained")  # the directory serves as it trained
    good, bad = scorer.score(
        [
            ScoreItem("What is 12 + 30?", "12 + 30 = 42"),
            ScoreItem("What is 12 + 30?", "12 + 30 = lots"),
        ]
    )
    assert good > bad  # type: ignore[operator]
    assert scorer.identity != f"rm-trained@{weights_hash(rm_dir)}"

    with pytest.raises(FileExistsError, match="not empty"):
        train_reward_model(digit_pairs(4), TINY_RM, out, log=lines.append)
    again = train_reward_model(digit_pairs(4), TINY_RM, out, overwrite=True, log=lines.append)
    assert json.loads((out / "rm_train.json").read_text()) == again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rm"]  # no staging left behind


def run_pairs(questions: int, seed: int = 0) -> list[Pair]:
    """Pairs as ``rm pairs`` makes them from a run: each question asked in several groups,
    so it has 1 to 6 pairs, some sharing their chosen response."""
    rng = random.Random(seed)
    pairs = []
    for q in range(questions):
        right = f"{q} + 1 = {q + 1}"
        pairs += [
            Pair(f"What is {q} + 1?", right, f"{q} + 1 = {w}") for w in range(rng.randint(1, 6))
        ]
    return pairs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_held_out_pairs_share_no_question_with_training_pairs(seed: int) -> None:
    """Issue 52: split one pair at a time, most held-out questions (and their chosen
    answers) were trained on. Split by question, none is, and the sides are counted."""
    pairs = run_pairs(60, seed)
    split = split_by_question(pairs, 0.25, seed)
    held = {pairs[i].prompt for i in split.held}
    trained = {pairs[i].prompt for i in split.train}
    assert held and not held & trained
    assert sorted(split.train + split.held) == list(range(len(pairs)))
    assert (split.questions_held_out, split.questions_train) == (len(held), len(trained))
    wanted = round(len(pairs) * 0.25)
    assert wanted <= len(split.held) < wanted + 6  # at most one question's pairs over
    assert split == split_by_question(list(pairs), 0.25, seed)  # seeded, deterministic
    assert split_by_question(pairs, 0.25, seed + 10).held != split.held


def test_a_split_with_nothing_to_hold_out_trains_on_every_pair() -> None:
    pairs = run_pairs(5)
    assert split_by_question(pairs, 0.0, 0).held == []
    one_question = [p for p in pairs if p.prompt == pairs[0].prompt]
    assert split_by_question(one_question, 0.5, 0).held == []  # one question always trains
    with pytest.raises(ValueError, match="held_out"):
        split_by_question(pairs, 1.0, 0)


def test_a_causal_lm_base_gets_a_seeded_new_head(tmp_path: Path) -> None:
    """From a causal LM (no score head in its weights), the same seed trains the same model."""
    lines: list[str] = []
    runs = [
        train_reward_model(
            digit_pairs(24), "tiny-random-llama", tmp_path / f"rm{i}", lr=1e-3, log=lines.append
        )
        for i in range(2)
    ]
    assert "a new score head" in lines[0]
    assert runs[0]["train_loss"] == runs[1]["train_loss"]
    assert weights_hash(tmp_path / "rm0") == weights_hash(tmp_path / "rm1")
    model, _ = load_reward_model(tmp_path / "rm0")
    assert type(model).__name__ == "LlamaForSequenceClassification"


# --------------------------------------------------------------------------- pairs from a run


def _logged_run(tmp_path: Path) -> tuple[Path, list[TrajectoryGroup]]:
    """A run directory as a run leaves it: config.yaml (the default job: arithmetic prompts,
    numeric_match among its rewards) and a buffer log of groups for prompts 0-4."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config(default_config_path())
    (run_dir / "config.yaml").write_text(to_yaml(config))
    stream = prompt_stream(config)

    def group(index: int, texts: list[str], prompt_id: str | None = None) -> TrajectoryGroup:
        prompt = stream[index] if index >= 0 else stream[0]
        trajectories = [
            Trajectory.from_lists([1, 2], [3], [-0.5], [0], 0.0, "stop", 0, response_text=t)
            for t in texts
        ]
        return TrajectoryGroup(
            f"g{index}-{len(texts)}",
            prompt_id or prompt.prompt_id,
            trajectories,
            0.0,
            1.0,
            prompt.data_source,
            prompt.ground_truth,
            prompt_index=index,
        )

    truth = [stream[i].ground_truth for i in range(5)]
    groups = [
        # two right (one twice), three wrong: 2 x 3 unequal pairs, max_per_group of them
        group(0, [truth[0], f"x = {truth[0]}", truth[0], "7777", "no idea", "12345"]),
        group(1, ["999999", "888888"]),  # all wrong: ties pair nothing
        group(2, [truth[2], "-4242"]),
        group(-1, [truth[0], "nope"]),  # not from the stream: skipped
        group(2, [truth[2], "-4242"]),  # the same prompt again: its pair is kept once
    ]
    with DurableLog(run_dir / "buffer", 0) as log:
        log.append_many(groups[:3])
    with DurableLog(run_dir / "buffer", 1) as log:
        log.append_many(groups[3:])
    return run_dir, groups


def test_pairs_from_run_ranks_responses_by_the_rule(tmp_path: Path) -> None:
    run_dir, groups = _logged_run(tmp_path)
    stream = prompt_stream(load_config(run_dir / "config.yaml"))
    pairs = pairs_from_run(run_dir, groups, "numeric_match", max_per_group=4, seed=0)

    def score(index: int, text: str) -> float:
        return numeric_match(RewardInput.of(stream[index], text, []))

    questions = {stream[i].messages[-1]["content"]: i for i in (0, 2)}
    assert [questions[p.prompt] for p in pairs] == [0, 0, 0, 0, 2]
    for pair in pairs:
        index = questions[pair.prompt]
        assert score(index, pair.chosen) == 1.0 and score(index, pair.rejected) == 0.0
    assert len(set(pairs)) == len(pairs)
    assert pairs == pairs_from_run(run_dir, groups, max_per_group=4, seed=0)  # seeded
    assert len(pairs_from_run(run_dir, groups, max_per_group=100)) == 6 + 1

    changed = groups[:2] + [
        TrajectoryGroup("g", "arith-other", groups[2].trajectories, 0.0, 1.0, prompt_index=2)
    ]
    with pytest.raises(ValueError, match="prompt 2 is arith-2 in the stream .* its data changed"):
        pairs_from_run(run_dir, changed)


def test_rm_pairs_reads_every_shard_of_a_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir, groups = _logged_run(tmp_path)
    out = tmp_path / "pairs.jsonl"
    assert main(["rm", "pairs", str(run_dir), "--out", str(out), "--max-per-group", "2"]) == 0
    assert "wrote 3 pairs from 5 logged groups" in capsys.readouterr().out
    assert read_pairs(out) == pairs_from_run(run_dir, groups, max_per_group=2)

    assert main(["rm", "pairs", str(tmp_path), "--out", str(out)]) == 2
    assert "no buffer log under" in capsys.readouterr().err
    assert main(["rm", "pairs", str(run_dir), "--out", str(out), "--reward", "nope"]) == 2
    assert "unknown reward 'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------- the CLI


@pytest.mark.slow
def test_rm_train_command(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    write_pairs(pairs, digit_pairs(20))
    out = tmp_path / "rm"

    def rm_train(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "streamrl.cli", "rm", "train", *args]
        return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)

    more = tmp_path / "more.jsonl"
    write_pairs(more, digit_pairs(25)[20:])
    done = rm_train(
        str(pairs), str(more), str(pairs), "--model", TINY_RM, "--out", str(out), "--lr", "1e-3"
    )
    assert done.returncode == 0, done.stderr
    trained, held = re.search(
        r"(\d+) pairs of \d+ questions to train on, (\d+) pairs", done.stdout
    ).groups()
    assert int(trained) + int(held) == 25  # three files, a pair in two kept once
    assert "held-out pairwise accuracy before" in done.stdout
    assert (
        f"wrote {out}" in done.stdout
        and "held-out pairwise accuracy" in done.stdout.splitlines()[-1]
    )
    model, _ = load_reward_model(out)
    assert type(model).__name__ == "LlamaForSequenceClassification"

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "q", "chosen": "a"}\n')
    for args, message in (
        ([str(bad), "--model", TINY_RM, "--out", str(tmp_path / "x")], f"{bad}:1: rejected"),
        ([str(tmp_path / "none.jsonl"), "--model", TINY_RM, "--out", str(out)], "not found"),
        ([str(pairs), "--model", "/no/such/model", "--out", str(tmp_path / "y")], "not found"),
        ([str(pairs), "--model", TINY_RM, "--out", str(out)], "not empty"),
    ):
        failed = rm_train(*args)
        lines = [line for line in failed.stderr.splitlines() if line.strip()]
        assert failed.returncode == 2 and len(lines) == 1, failed.stderr
        assert lines[0].startswith("streamrl rm train: ") and message in lines[0]
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_pairs_from_run_ranked_by_the_logged_reward(tmp_path: Path) -> None:
    """reward="logged": the reward each response was trained with ranks it, so a right answer
    the model ended (2.0 under the default job) beats the same answer run on (1.75), which
    numeric_match alone scores alike."""
    run_dir, _ = _logged_run(tmp_path)
    stream = prompt_stream(load_config(run_dir / "config.yaml"))
    truth = stream[0].ground_truth
    scored = [(f"{truth}", 2.0), (f"{truth}\n\nAnswer with the number only.", 1.75), ("7", 0.25)]
    trajectories = [
        Trajectory.from_lists([1, 2], [3], [-0.5], [0], r, "stop", 0, response_text=t)
        for t, r in scored
    ]
    group = TrajectoryGroup("g", stream[0].prompt_id, trajectories, 0.0, 1.0, prompt_index=0)
    pairs = pairs_from_run(run_dir, [group], "logged", max_per_group=10)
    rank = {t: r for t, r in scored}
    assert len(pairs) == 3 and all(rank[p.chosen] > rank[p.rejected] for p in pairs)
    by_rule = pairs_from_run(run_dir, [group], "numeric_match", max_per_group=10)
    assert len(by_rule) == 2  # the ended and the run-on answer tie under the rule


def test_pairs_from_run_mark_a_response_cut_at_the_token_limit(tmp_path: Path) -> None:
    """The same words ended and cut are two responses; each pair says which side was cut."""
    run_dir, _ = _logged_run(tmp_path)
    stream = prompt_stream(load_config(run_dir / "config.yaml"))
    truth = stream[0].ground_truth
    ends = [(truth, "stop", 2.0), (truth, "length", 1.0), ("7", "stop", 0.25)]
    trajectories = [
        Trajectory.from_lists([1, 2], [3], [-0.5], [0], r, end, 0, response_text=t)
        for t, end, r in ends
    ]
    group = TrajectoryGroup("g", stream[0].prompt_id, trajectories, 0.0, 1.0, prompt_index=0)
    pairs = pairs_from_run(run_dir, [group], "logged", max_per_group=10)
    assert {(p.chosen_stopped, p.rejected, p.rejected_stopped) for p in pairs} == {
        (False, "7", True),
        (True, "7", True),
        (True, truth, False),
    }
    assert len(pairs) == 3
