"""Training a sequence-classification reward model (``streamrl rm train``) on preference
pairs (``Pair``), and making pairs from a run's own logged responses ranked by a rule verifier
(``pairs_from_run``, ``streamrl rm pairs``). The text, token ids and scores are
``streamrl.rewards.model``'s, the ones a served model is scored with (its module doc: why).

The loss is Bradley-Terry, as in InstructGPT's reward model (Ouyang et al. 2022) and TRL's
``RewardTrainer``: P(chosen over rejected) = sigmoid(r_c - r_r), trained on the mean of
-log sigmoid(r_c - r_r). No margin and no centring term: scores carry an arbitrary offset,
which a reward's ``normalize`` setting takes out when it matters.

Example::

    pairs = read_pairs(Path("pairs.jsonl"))
    train_reward_model(pairs, "smollm2-135m-instruct", Path("rm-smol"), epochs=2)
    scorer = RewardModelScorer(Path("rm-smol"), "rm-smol")  # streamrl.rewards.model
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from streamrl.files import atomic_write_text
from streamrl.models import load_tokenizer, resolve_model
from streamrl.rewards.base import RewardInput, resolve_reward
from streamrl.rewards.model import batch_scores, is_reward_model, reward_ids, score_sequences

if TYPE_CHECKING:
    from streamrl.protocol import TrajectoryGroup

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pair:
    """One preference: ``chosen`` answers ``prompt`` (the question) better than ``rejected``.
    ``*_stopped`` False: that response was cut at the token limit, not ended by its model
    (scored without an end-of-turn marker, ``streamrl.rewards.model.reward_text``)."""

    prompt: str
    chosen: str
    rejected: str
    chosen_stopped: bool = True
    rejected_stopped: bool = True


# --------------------------------------------------------------------------- pairs


def read_pairs(path: Path) -> list[Pair]:
    """The pairs of a JSONL file, one ``{"prompt", "chosen", "rejected"}`` object (strings) a
    line, with optional booleans ``chosen_stopped`` and ``rejected_stopped`` (default true:
    false marks a response cut at the token limit); blank lines are skipped. Anything else,
    or no pair at all, is a one-line ``ValueError`` naming ``file:line``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pairs file not found: {path}")
    pairs = []
    with path.open(encoding="utf-8", errors="strict") as f:
        try:
            lines = list(f)
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: not a JSON object with prompt, chosen and rejected")
        bad = [k for k in ("prompt", "chosen", "rejected") if not isinstance(row.get(k), str)]
        if bad:
            raise ValueError(f"{where}: {', '.join(bad)} missing or not a string")
        flags = [row.get(k, True) for k in ("chosen_stopped", "rejected_stopped")]
        if not all(isinstance(flag, bool) for flag in flags):
            raise ValueError(f"{where}: chosen_stopped and rejected_stopped must be true or false")
        if (row["chosen"], flags[0]) == (row["rejected"], flags[1]):
            raise ValueError(f"{where}: chosen and rejected are the same text")
        pairs.append(Pair(row["prompt"], row["chosen"], row["rejected"], *flags))
    if not pairs:
        raise ValueError(f"{path}: no pairs in the file")
    return pairs


def write_pairs(path: Path, pairs: Iterable[Pair]) -> None:
    """``pairs`` as the JSONL that ``read_pairs`` reads, written atomically."""
    lines = [json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in pairs]
    atomic_write_text(path, "".join(lines))


LOGGED = "logged"  # rank by the reward each response was trained with


def pairs_from_run(
    run_dir: Path,
    groups: Iterable[TrajectoryGroup],
    reward: str = "numeric_match",
    max_per_group: int = 4,
    seed: int = 0,
) -> list[Pair]:
    """Preference pairs from a run's logged ``groups`` (the CLI reads them from
    ``run_dir/buffer/``: only it and the controller import buffers, docs/design.md §2).

    Each group's question is its prompt rebuilt from ``run_dir/config.yaml``'s prompt stream
    (``prompt_stream(config)[prompt_index]``, its last message: what a served scorer is
    shown); a group whose prompt id differs from the rebuilt one means the stream changed
    (``ValueError``). Each distinct response is scored by the rule ``reward`` (the run's own
    ``args`` for it, when the run has that reward) with the prompt's ground truth, or with
    ``reward="logged"`` by the reward the run trained it with (its rewards weighted and
    summed: the default job's also prefer a right answer the model ended to one it ran on
    after, which ``numeric_match`` alone ranks alike); up to
    ``max_per_group`` (higher, lower) pairs are drawn at random (``seed``) among the group's
    unequal scores. Ties pair nothing; identical pairs are kept once. Groups with no prompt
    index or multi-turn episodes (which reward roles do not score) are skipped and counted.
    """
    from streamrl.config import load_config
    from streamrl.data import prompt_stream

    config_path = Path(run_dir) / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory: it has no config.yaml")
    config = load_config(config_path)
    stream = prompt_stream(config)
    rule = None if reward == LOGGED else resolve_reward(reward)
    kwargs = next((dict(s.args) for s in config.rewards if s.name == reward), {})
    rng, pairs, kept, skipped = random.Random(seed), [], set(), 0
    for group in groups:
        if group.prompt_index < 0 or any(t.turns for t in group.trajectories):
            skipped += 1
            continue
        prompt = stream[group.prompt_index]
        if prompt.prompt_id != group.prompt_id:
            raise ValueError(
                f"{run_dir}: prompt {group.prompt_index} is {prompt.prompt_id} in the stream "
                f"config.yaml builds but {group.prompt_id} in the log: its data changed"
            )
        scored: dict[tuple[str, bool], float] = {}  # (text, stopped): a cut text is another
        for t in group.trajectories:
            response = (t.response_text, t.finish_reason == "stop")
            if response in scored:
                continue
            if rule is None:
                scored[response] = float(t.reward)
            else:
                sample = RewardInput.of(prompt, t.response_text, t.response_list(), t.finish_reason)
                scored[response] = float(rule(sample, **kwargs))
        candidates = [(a, b) for a, sa in scored.items() for b, sb in scored.items() if sa > sb]
        rng.shuffle(candidates)
        for chosen, rejected in candidates[:max_per_group]:
            pair = Pair(prompt.question, chosen[0], rejected[0], chosen[1], rejected[1])
            if pair not in kept:
                kept.add(pair)
                pairs.append(pair)
    if skipped:
        logger.warning(
            "%s: %d logged groups skipped (no prompt index, or episodes)", run_dir, skipped
        )
    return pairs


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class PairSplit:
    """Indices into a list of pairs: ``train`` and ``held`` (disjoint, together all of
    them, each ascending), and how many distinct questions each side has."""

    train: list[int]
    held: list[int]
    questions_train: int
    questions_held_out: int


def _question_rank(seed: int, question: str) -> bytes:
    """A question's place in the held-out draw: a hash of (``seed``, question), the same on
    every machine and in every pairs file."""
    return hashlib.blake2b(f"{seed}\0{question}".encode(), digest_size=8).digest()


def split_by_question(pairs: Sequence[Pair], held_out: float, seed: int) -> PairSplit:
    """Split ``pairs`` into training and held-out by question (``Pair.prompt``), so that no
    question, and so no response to it, is on both sides: a pair split one at a time puts
    the same question, often the same chosen answer, on both, and its held-out accuracy
    reads how well the model remembers them (issue 52: 0.56 -> 0.69 was partly that).

    Questions are taken in the order of a seeded hash (``_question_rank``) into the held-out
    side until it has ``round(len(pairs) * held_out)`` pairs or more (0: none), and one
    question always trains, so with one question nothing is held out. The held-out share is
    near ``held_out``, above it by less than the pairs of the last question taken. A
    question's rank does not depend on the other pairs, so two pairs files of one run hold
    out the same questions where the cut allows.

    Example: questions q1 (3 pairs), q2 (1), q3 (1), held_out 0.4 -> 2 pairs wanted; in
    hash order q3, q1, q2 that is q3 (1 pair, short of 2), then q1 (4 held): held = the
    pairs of q3 and q1, train = q2's; ``questions_held_out == 2``, ``questions_train == 1``.
    """
    if not 0 <= held_out < 1:
        raise ValueError(f"held_out must be in [0, 1), got {held_out}")
    by_question: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        by_question.setdefault(pair.prompt, []).append(i)
    order = sorted(by_question, key=lambda q: _question_rank(seed, q))
    wanted = round(len(pairs) * held_out)
    held_questions: list[str] = []
    taken = 0
    for question in order[:-1]:  # the last in the draw always trains
        if taken >= wanted:
            break
        held_questions.append(question)
        taken += len(by_question[question])
    held = sorted(i for q in held_questions for i in by_question[q])
    chosen = set(held)
    train = [i for i in range(len(pairs)) if i not in chosen]
    return PairSplit(train, held, len(by_question) - len(held_questions), len(held_questions))


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """[P] chosen scores, [P] rejected scores -> the scalar mean of -log sigmoid(r_c - r_r)."""
    return -F.logsigmoid(chosen - rejected).mean()


def train_reward_model(
    pairs: Sequence[Pair],
    base: str,
    out_dir: Path,
    *,
    epochs: int = 1,
    lr: float = 1e-5,
    batch_size: int = 8,
    held_out: float = 0.1,
    seed: int = 0,
    max_tokens: int = 512,
    device: str = "cpu",
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train a reward model from ``base`` (any name ``resolve_model`` takes) on ``pairs`` and
    save it to ``out_dir``: an HF directory that ``load_reward_model`` loads (float32
    safetensors, the tokenizer) plus ``rm_train.json``, the figures returned. A base that is
    not a reward model gets a new head, drawn N(0, initializer_range) from ``seed``.
    About ``held_out`` of the pairs are never trained on, whole questions at a time
    (``split_by_question``: no held-out pair's question is in a training pair, so the
    held-out accuracy, measured before and after, is on questions the model never saw).
    AdamW at a constant ``lr``, gradients clipped to norm 1 (TRL's default). ``out_dir`` is
    built beside itself and renamed into place; a non-empty one is refused
    (``FileExistsError``) unless ``overwrite``."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    out_dir = Path(out_dir)
    _check_out_dir(out_dir, overwrite)
    if not 0 <= held_out < 1 or min(epochs, batch_size) < 1 or max_tokens < 2 or not pairs:
        raise ValueError("need pairs, 0 <= held_out < 1, epochs, batch_size >= 1, max_tokens >= 2")
    started = time.monotonic()
    model_dir = resolve_model(base)
    tokenizer = load_tokenizer(model_dir)
    new_head = not is_reward_model(AutoConfig.from_pretrained(model_dir))
    torch.manual_seed(seed)  # the new head's draw
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=1, dtype=torch.float32
    ).to(device)
    model.config.pad_token_id = pad_id = tokenizer.pad_token_id
    encoded = [
        (reward_ids(tokenizer, p.prompt, p.chosen, max_tokens, p.chosen_stopped),
         reward_ids(tokenizer, p.prompt, p.rejected, max_tokens, p.rejected_stopped))
        for p in pairs
    ]  # fmt: skip
    split = split_by_question(pairs, held_out, seed)
    held, train = [encoded[i] for i in split.held], [encoded[i] for i in split.train]
    rng = random.Random(seed)
    log(
        f"base {base} ({model_dir}), {'a new' if new_head else 'its own'} score head: "
        f"{len(train)} pairs of {split.questions_train} questions to train on, {len(held)} "
        f"pairs of {split.questions_held_out} other questions held out"
    )
    before = _accuracy(model, held, pad_id, batch_size * 2)
    log(f"held-out pairwise accuracy before: {accuracy_text(before)}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    steps, step = epochs * math.ceil(len(train) / batch_size), 0
    model.train()
    for epoch in range(1, epochs + 1):
        rng.shuffle(train)
        losses = []
        for first in range(0, len(train), batch_size):
            losses.append(_step(model, optimizer, train[first : first + batch_size], pad_id))
            step += 1
            if step % max(1, steps // 10) == 0 or step == steps:
                elapsed = time.monotonic() - started
                log(f"epoch {epoch} step {step}/{steps}: loss {losses[-1]:.4f} ({elapsed:.0f} s)")
    after = _accuracy(model.eval(), held, pad_id, batch_size * 2)
    log(f"held-out pairwise accuracy after: {accuracy_text(after)}")
    figures = {
        "base": base, "pairs_train": len(train), "pairs_held_out": len(held),
        "questions_train": split.questions_train, "questions_held_out": split.questions_held_out,
        "accuracy_before": before, "accuracy_after": after,
        "train_loss": sum(losses) / len(losses),  # the last epoch's mean
        "epochs": epochs, "steps": steps, "lr": lr, "batch_size": batch_size,
        "max_tokens": max_tokens, "seed": seed, "device": device,
        "seconds": round(time.monotonic() - started, 1), "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }  # fmt: skip

    def write(staging: Path) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "rm_train.json").write_text(json.dumps(figures, indent=2) + "\n")

    _publish(out_dir, overwrite, write)
    return figures


def _step(
    model: Any, optimizer: Any, batch: list[tuple[list[int], list[int]]], pad_id: int
) -> float:
    """One optimizer step on ``batch``'s pairs (chosen and rejected in one forward); its loss."""
    scores = batch_scores(model, [c for c, _ in batch] + [r for _, r in batch], pad_id)
    loss = bradley_terry_loss(scores[: len(batch)], scores[len(batch) :])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def _accuracy(
    model: Any, pairs: list[tuple[list[int], list[int]]], pad_id: int, batch_size: int
) -> float | None:
    """The share of ``pairs`` whose chosen text scores strictly above the rejected one (a tie
    is a miss), in eval mode; None for no pairs."""
    if not pairs:
        return None
    was_training, n = model.training, len(pairs)
    scored = score_sequences(
        model.eval(), [c for c, _ in pairs] + [r for _, r in pairs], pad_id, batch_size
    )
    model.train(was_training)
    return sum(c > r for c, r in zip(scored[:n], scored[n:], strict=True)) / n


def accuracy_text(accuracy: float | None) -> str:
    """A held-out pairwise accuracy as ``rm train`` prints it."""
    return "n/a (no held-out pairs)" if accuracy is None else f"{accuracy:.3f}"


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty (overwrite to replace it)")


def _publish(out_dir: Path, overwrite: bool, write: Callable[[Path], None]) -> None:
    """``out_dir`` written whole or not at all: ``write`` fills a new directory beside it,
    renamed into place (one it replaces is moved aside first, then removed)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    old = staging.with_name(staging.name + ".old")
    try:
        write(staging)
        _check_out_dir(out_dir, overwrite)  # it may have been filled meanwhile
        if out_dir.exists():
            out_dir.rename(old)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
