"""Sequence-classification reward models served: scoring with one (``RewardModelScorer``,
the ``Scorer`` a reward role serves, docs/design.md §7). Training one on preference pairs is
``streamrl.rewards.model_training`` (``streamrl rm train``, ``streamrl rm pairs``).

Training and serving share this module's functions because a served score means something
only if both agree on three things: the text (``reward_text``: the chat template of [user:
question, assistant: response], else plain text), the token ids (``reward_ids``: cut from the
left to ``max_tokens``, so the response's end, where the score is read, is always kept), and
where the score is read (HF's rule: the last token that is not ``config.pad_token_id``, so
batches are right-padded (``batch_scores``) and the pad id is set at load).

Example::

    scorer = RewardModelScorer(Path("rm-smol"), "rm-smol")
    scorer.identity                                        # "rm-smol@3f9a1c2b7d01"
    scorer.score([ScoreItem("What is 2 + 2?", "2 + 2 = 4")])  # [1.73]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from streamrl.models import has_chat_template, load_tokenizer, plain_prompt
from streamrl.rewards.scorer import ScoreItem, scorer_identity


def reward_text(tokenizer: Any, prompt: str, response: str, stopped: bool = True) -> str:
    """The one text a (question, response) is scored as, in training and in serving: the
    tokenizer's chat template of [user: prompt, assistant: response] (no generation prompt),
    else ``plain_prompt``'s plain text (``"{prompt}\\n{response}\\n"``).

    A response that did not stop (cut at the token limit: ``stopped`` False) is scored as
    the policy wrote it: the question as the policy was asked it (with the generation
    prompt, as ``encode_prompt`` asks), then the response, and nothing the template puts
    after an answer (its end-of-turn marker). Otherwise a reward model reads a response cut
    mid-sentence as one the model ended, and a policy that learns to run on is paid as if
    it had answered (issue 54's RLHF job)."""
    asked = [{"role": "user", "content": prompt}]
    chat = has_chat_template(tokenizer)
    if not stopped:
        opened = (
            tokenizer.apply_chat_template(asked, add_generation_prompt=True, tokenize=False)
            if chat
            else plain_prompt(asked)
        )
        return opened + response
    messages = [*asked, {"role": "assistant", "content": response}]
    if chat:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return plain_prompt(messages)


def reward_ids(
    tokenizer: Any, prompt: str, response: str, max_tokens: int, stopped: bool = True
) -> list[int]:
    """``reward_text``'s token ids, its last ``max_tokens`` only: a long question loses its
    start, never the response's end, where the score is read. A chat template's text holds
    its own special tokens (Gemma's ``<bos>``); plain text gets the tokenizer's."""
    text = reward_text(tokenizer, prompt, response, stopped)
    ids = tokenizer(text, add_special_tokens=not has_chat_template(tokenizer))["input_ids"]
    return list(ids[-max_tokens:])


def batch_scores(model: Any, sequences: Sequence[list[int]], pad_id: int) -> torch.Tensor:
    """[N] float32 scores of N token sequences, run as one right-padded batch. Right padding
    leaves every real token's position and attention as in a batch of one, and the head reads
    the last non-pad token, so a score does not depend on what it is batched with."""
    ids = torch.full((len(sequences), max(map(len, sequences))), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    device = next(model.parameters()).device
    return model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, 0].float()


@torch.inference_mode()
def score_sequences(
    model: Any, sequences: Sequence[list[int]], pad_id: int, batch_size: int
) -> list[float]:
    """Scores of ``sequences`` in batches of similar lengths (sorted, so little is padding),
    returned in the order given."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    scores = [0.0] * len(sequences)
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        values = batch_scores(model, [sequences[i] for i in chunk], pad_id).tolist()
        for i, value in zip(chunk, values, strict=True):
            scores[i] = value
    return scores


def load_reward_model(
    model_dir: Path, device: str = "cpu", dtype: torch.dtype | None = None
) -> tuple[Any, Any]:
    """(model, tokenizer) of a sequence-classification reward model directory, in eval mode.
    Refused in one line (``ValueError``): a directory whose model is not a sequence
    classifier, or has other than one label. ``dtype``: float32 on a CPU and bfloat16 on a
    GPU unless given. The pad token is the tokenizer's (EOS when it has none), written into
    ``config.pad_token_id``, which the head reads to find each sequence's last token."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(model_dir)
    if not is_reward_model(config):
        found = ", ".join(config.architectures or []) or "none named"
        raise ValueError(
            f"{model_dir} is not a reward model (architectures: {found}): train one with "
            "`streamrl rm train`"
        )
    if config.num_labels != 1:
        raise ValueError(f"{model_dir}: a reward model has 1 label, this has {config.num_labels}")
    if dtype is None:
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=dtype)
    tokenizer = load_tokenizer(model_dir)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


def is_reward_model(config: Any) -> bool:
    """A sequence classifier by its config's ``architectures`` (its head is in the weights)."""
    return any(a.endswith("ForSequenceClassification") for a in config.architectures or [])


def weights_hash(model_dir: Path) -> str:
    """12 hex digits naming the weights: xxh3-64 over the bytes of the directory's
    ``*.safetensors`` files in name order, read in chunks (the judge's rule,
    workers/reward_roles/judge.py, so one directory has one identity in both). blake2b where
    xxhash is missing (it is a dependency): other digits, never mixed with xxhash's within one
    install."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weights")
    try:
        import xxhash

        digest: Any = xxhash.xxh3_64()
    except ImportError:
        digest = hashlib.blake2b(digest_size=8)
    for path in files:
        with path.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:12]


class RewardModelScorer:
    """The ``Scorer`` of a sequence-classification reward model: one float per item, from
    ``reward_text`` of its question and response (its ``ground_truth`` is not shown to the
    model; a response cut at the token limit is shown without an end), never None.
    ``identity`` is ``"<label>@<weights_hash>"``."""

    def __init__(
        self,
        model_dir: Path,
        label: str,
        device: str = "cpu",
        max_tokens: int = 1024,
        batch_size: int = 16,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.model, self.tokenizer = load_reward_model(Path(model_dir), device, dtype)
        self.identity = scorer_identity(label, weights_hash(Path(model_dir)))
        self.max_tokens, self.batch_size = max_tokens, batch_size

    def score(self, items: list[ScoreItem]) -> list[float | None]:
        sequences = [
            reward_ids(self.tokenizer, item.prompt, item.response, self.max_tokens, item.stopped)
            for item in items
        ]
        pad_id = self.model.config.pad_token_id
        return list(score_sequences(self.model, sequences, pad_id, self.batch_size))
