"""A teacher as a served scorer (``rewards: - teacher: {...}``; docs/design.md §7d).

The teacher is a causal LM with the student's tokenizer. Given the tokens a generator sampled
(prompt and response, as int32 arrays) and the temperature they were sampled at, it returns
the log-probability of each response token under the teacher at that temperature: one
forward over the whole sequence, batched across requests, float32 softmax. The learner turns
them into the per-token reverse-KL advantage ``teacher - sampled`` (on-policy distillation,
``streamrl.algorithms.advantages.distill``).

With ``top_k`` it also sends, per response position, its k likeliest tokens and their
logprobs (the learner's forward-KL term, ``losses.distill_topk``).

Rows are left-padded so that every response ends in the last column, with position ids that
count real tokens only, and only the last ``longest response`` columns reach the output head
(``logits_to_keep``): a row's logprobs do not depend on what it is batched with (the tests
hold this to bf16 rounding), and a batch never builds [rows, sequence, vocabulary] logits.

Example: prompt [1, 5], response [7, 9] at temperature 0.7 -> 8 bytes: log p(7 | 1 5) and
log p(9 | 1 5 7), each from the teacher's logits over 0.7.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from streamrl.models import load_causal_lm, load_tokenizer
from streamrl.protocol import unpack_int32
from streamrl.rewards.model import weights_hash
from streamrl.rewards.scorer import ScoreItem, TokenAnswer, scorer_identity

# Rows x kept columns of one forward: bounds the logits a batch holds (about 200 MB of bf16
# logits for a 49k vocabulary).
TOKENS_PER_FORWARD = 2048


class TeacherScorer:
    """The ``TokenScorer`` of one teacher model (``streamrl.rewards.scorer``): ``score`` takes
    items carrying their sampled tokens and returns, per item, a ``TokenAnswer``: one
    log-probability per response token, and with ``top_k`` the k likeliest tokens at each
    position. An item longer than the teacher's positions raises (its request is answered
    with the error and its group refused, counted)."""

    per_token = True

    def __init__(
        self,
        model_dir: Path,
        label: str,
        *,
        device: str = "cpu",
        compute_dtype: torch.dtype | str = torch.float32,
        top_k: int = 0,
        model: torch.nn.Module | None = None,
    ) -> None:
        """``model``: score with this one (a lagged teacher's, whose weights it moves) rather
        than load ``model_dir``'s."""
        self.device, self.top_k = device, top_k
        self.tokenizer = load_tokenizer(model_dir)
        self.identity = scorer_identity(label, weights_hash(model_dir))
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self.max_tokens = int(config.get("max_position_embeddings") or 2048)
        dtype_name = str(compute_dtype).removeprefix("torch.")
        if model is None:
            model = load_causal_lm(model_dir, dtype=dtype_name, device=device).eval()
        self.model = model

    @torch.inference_mode()
    def score(self, items: list[ScoreItem]) -> list[TokenAnswer]:
        sequences = [(unpack_int32(i.prompt_ids), unpack_int32(i.response_ids)) for i in items]
        for n, (prompt, response) in enumerate(sequences):
            if not prompt:
                raise ValueError(f"item {n}: no prompt tokens (a teacher scores tokens)")
            if len(prompt) + len(response) > self.max_tokens:
                raise ValueError(
                    f"item {n}: {len(prompt) + len(response)} tokens, more than the teacher's "
                    f"{self.max_tokens} positions"
                )
        out = [TokenAnswer(b"")] * len(items)
        # Same temperature together, then by length: little padding per forward.
        order = sorted(
            (n for n, (_, response) in enumerate(sequences) if response),
            key=lambda n: (items[n].temperature, len(sequences[n][0]) + len(sequences[n][1])),
        )
        start = 0
        while start < len(order):
            rows = self._batch(order, start, sequences, items)
            answers = self._answers([sequences[n] for n in rows], items[rows[0]].temperature)
            for n, answer in zip(rows, answers, strict=True):
                out[n] = answer
            start += len(rows)
        return out

    def _batch(
        self, order: list[int], start: int, sequences: list, items: list[ScoreItem]
    ) -> list[int]:
        """The rows of the next forward: one temperature, within ``TOKENS_PER_FORWARD``."""
        rows = [order[start]]
        longest = len(sequences[order[start]][1])
        for n in order[start + 1 :]:
            if items[n].temperature != items[rows[0]].temperature:
                break
            longest = max(longest, len(sequences[n][1]))
            if (len(rows) + 1) * (longest + 1) > TOKENS_PER_FORWARD:
                break
            rows.append(n)
        return rows

    def _answers(
        self, sequences: list[tuple[list[int], list[int]]], temperature: float
    ) -> list[TokenAnswer]:
        """Per row, its response tokens' logprobs (and top-k) from one forward."""
        width = max(len(p) + len(r) for p, r in sequences)
        longest = max(len(r) for _, r in sequences)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(sequences), width), pad, dtype=torch.long)
        attention = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, (prompt, response) in enumerate(sequences):
            tokens = prompt + response
            ids[row, width - len(tokens) :] = torch.tensor(tokens)
            attention[row, width - len(tokens) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        ids, attention = ids.to(self.device), attention.to(self.device)
        # Column c predicts token c + 1: the last ``longest`` tokens are predicted by the
        # ``longest`` columns before the last one.
        logits = self.model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions.to(self.device),
            logits_to_keep=longest + 1,
        ).logits[:, :-1]
        answers = []
        for row, (_, response) in enumerate(sequences):
            # One row's [r, V] in float32 at a time: never the batch's.
            z = logits[row, longest - len(response) :].float() / temperature
            lse = torch.logsumexp(z, dim=-1, keepdim=True)
            target = torch.tensor(response, device=z.device)[:, None]
            chosen = (z.gather(1, target) - lse)[:, 0].cpu()
            answer = TokenAnswer(chosen.numpy().astype("<f4").tobytes())
            if self.top_k:
                top = z.topk(self.top_k, dim=-1)
                answer = TokenAnswer(
                    answer.logprobs,
                    top.indices.cpu().numpy().astype("<i4").tobytes(),
                    (top.values - lse).cpu().numpy().astype("<f4").tobytes(),
                )
            answers.append(answer)
        return answers
