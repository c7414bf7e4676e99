"""A teacher as a served scorer (``rewards: - teacher: {...}``; docs/design.md §7d).

The teacher is a causal LM with the student's tokenizer. Given the tokens a generator sampled
(prompt and response, as int32 arrays) and the temperature they were sampled at, it returns
the log-probability of each response token under the teacher at that temperature: one
forward over the whole sequence, batched across requests, float32 softmax. The learner turns
them into the per-token reverse-KL advantage ``teacher - sampled`` (on-policy distillation,
``streamrl.algorithms.advantages.distill``).

With ``top_k`` it also sends, per response position, its k likeliest tokens and their
logprobs (the learner's forward-KL term, ``losses.distill_topk``).

Rows: where the model takes a 4-D mask (eager or SDPA attention, no sliding-window layer), a
row per distinct prompt holds it once and then each of its responses (``shared_rows``, the
learner's shared-prompt layout): a group's 8 samples of the default job cost 29 + 8 x ~10
tokens instead of 8 x 39. Otherwise a row per response, left-padded so that every response
ends in the last column, with position ids that count real tokens only (``plain_rows``).
Either way only the columns from the first prediction on reach the output head
(``logits_to_keep``): a response's logprobs do not depend on what it is batched with (the
tests hold this to bf16 rounding), and a batch never builds [rows, sequence, vocabulary]
logits.

Example: prompt [1, 5], response [7, 9] at temperature 0.7 -> 8 bytes: log p(7 | 1 5) and
log p(9 | 1 5 7), each from the teacher's logits over 0.7.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from streamrl.models import load_causal_lm, load_tokenizer
from streamrl.protocol import unpack_int32
from streamrl.rewards.model import weights_hash
from streamrl.rewards.scorer import ScoreItem, TokenAnswer, scorer_identity
from streamrl.workers.shared_prompts import (
    additive_mask,
    can_share_prompts,
    shared_prompt_attention,
)

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
        target_tau: float = 1.0,
        model: torch.nn.Module | None = None,
    ) -> None:
        """``model``: score with this one (a lagged teacher's, whose weights it moves) rather
        than load ``model_dir``'s. ``target_tau``: the top-k's temperature over the sampling
        temperature (``TeacherSpec.target_tau``)."""
        self.device, self.top_k, self.target_tau = device, top_k, target_tau
        self.tokenizer = load_tokenizer(model_dir)
        self.identity = scorer_identity(label, weights_hash(model_dir))
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self.max_tokens = int(config.get("max_position_embeddings") or 2048)
        dtype_name = str(compute_dtype).removeprefix("torch.")
        if model is None:
            model = load_causal_lm(model_dir, dtype=dtype_name, device=device).eval()
        self.model = model
        self.dtype = next(model.parameters()).dtype
        # A group's responses over one copy of its prompt (``shared_rows``) where the model
        # takes a 4-D mask: the default job's group is 8 x (29 + ~10) tokens one by one,
        # 29 + 8 x ~10 shared.
        self.share_prompts = can_share_prompts(getattr(model, "config", None))

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
        # Same temperature together, then by length (a prompt's responses next to each
        # other, to share it): little padding per forward.
        order = sorted(
            (n for n, (_, response) in enumerate(sequences) if response),
            key=lambda n: (items[n].temperature, len(sequences[n][0]), sequences[n][0]),
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
        """The rows of the next forward: one temperature, its kept logits (``kept_cells``
        in this scorer's layout) within ``TOKENS_PER_FORWARD``."""
        rows = [order[start]]
        kept = KeptCells(self.share_prompts)
        kept.add(*sequences[rows[0]])
        for n in order[start + 1 :]:
            if items[n].temperature != items[rows[0]].temperature:
                break
            if kept.after(*sequences[n]) > TOKENS_PER_FORWARD:
                break
            kept.add(*sequences[n])
            rows.append(n)
        return rows

    def _layout(self, sequences: list[tuple[list[int], list[int]]]) -> Rows:
        pad = self.tokenizer.pad_token_id or 0
        if self.share_prompts:
            return shared_rows(sequences, pad, self.dtype)
        return plain_rows(sequences, pad)

    def _answers(
        self, sequences: list[tuple[list[int], list[int]]], temperature: float
    ) -> list[TokenAnswer]:
        """Per row, its response tokens' logprobs (and top-k) from one forward."""
        layout = self._layout(sequences)
        ids, kwargs = layout.input_ids.to(self.device), layout.model_inputs(self.device)
        logits = self.model(input_ids=ids, **kwargs, logits_to_keep=layout.keep).logits
        answers = []
        for (_, response), (row, columns) in zip(sequences, layout.where, strict=True):
            # One response's [r, V] in float32 at a time: never the batch's.
            z = logits[row, columns].float() / temperature
            lse = torch.logsumexp(z, dim=-1, keepdim=True)
            target = torch.tensor(response, device=z.device)[:, None]
            chosen = (z.gather(1, target) - lse)[:, 0].cpu()
            answer = TokenAnswer(chosen.numpy().astype("<f4").tobytes())
            if self.top_k:
                # A sharper target (target_tau < 1) has the same top-k, in the same order.
                zt = z if self.target_tau == 1.0 else z / self.target_tau
                lse_t = lse if self.target_tau == 1.0 else torch.logsumexp(zt, -1, keepdim=True)
                top = zt.topk(self.top_k, dim=-1)
                answer = TokenAnswer(
                    answer.logprobs,
                    top.indices.cpu().numpy().astype("<i4").tobytes(),
                    (top.values - lse_t).cpu().numpy().astype("<f4").tobytes(),
                )
            answers.append(answer)
        return answers


@dataclass
class Rows:
    """One forward's rows, and where each response's predictions are among its kept logits."""

    input_ids: torch.Tensor  # [S, W]
    # [S, W] 0/1 (left-padded rows, one response each) or [S, W, W] bool (shared prompts)
    attention: torch.Tensor
    positions: torch.Tensor  # [S, W] position ids
    keep: int  # ``logits_to_keep``: the last ``keep`` columns
    # Per response, in order: its row and the kept columns that predict its tokens.
    where: list[tuple[int, torch.Tensor]]
    dtype: torch.dtype = torch.float32  # the forward's, for a 4-D mask

    def model_inputs(self, device: str) -> dict[str, torch.Tensor]:
        mask = self.attention
        if mask.dim() == 3:
            mask = additive_mask(mask, self.dtype)
        return {"attention_mask": mask.to(device), "position_ids": self.positions.to(device)}


@dataclass
class KeptCells:
    """Rows x kept columns of the logits a forward of the sequences added so far holds:
    ``plain_rows`` keeps the longest response + 1 columns of every row; ``shared_rows`` keeps,
    in each prompt's row, from the shortest prompt's last column to the longest row's end (rows
    are right-padded, so one prompt with many long responses widens them all). Kept a row at a
    time because the batcher asks before each row it adds: recounting the batch for each was
    quadratic (21 ms of a 200-row forward's batching).

    Example (shared): prompts of 3 tokens, responses of 2 and 4 under one prompt, 1 under
    another: ends 3 + 2 + 4 = 9 and 3 + 1 = 4, so 2 rows x (9 - 3 + 1) = 14 cells."""

    shared: bool
    rows: int = 0
    longest: int = 0  # plain: the longest response; shared: the furthest row end
    shortest: int = 0  # shared: the shortest prompt (plain: 0, so one formula counts both)
    ends: dict[tuple[int, ...], int] = field(default_factory=dict)  # shared: a row's end

    def after(self, prompt: list[int], response: list[int]) -> int:
        """The cells once ``(prompt, response)`` is added (nothing changes)."""
        rows, longest, shortest, _, _ = self._grown(prompt, response)
        return rows * (longest - shortest + 1)

    def add(self, prompt: list[int], response: list[int]) -> None:
        self.rows, self.longest, self.shortest, key, end = self._grown(prompt, response)
        if self.shared:
            self.ends[key] = end

    @property
    def cells(self) -> int:
        return self.rows * (self.longest - self.shortest + 1)

    def _grown(
        self, prompt: list[int], response: list[int]
    ) -> tuple[int, int, int, tuple[int, ...] | None, int]:
        """(rows, longest, shortest, the prompt's key, its row's end) with the sequence in."""
        if not self.shared:
            return self.rows + 1, max(self.longest, len(response)), 0, None, 0
        key = tuple(prompt)
        end = self.ends.get(key, len(prompt)) + len(response)
        shortest = min(self.shortest, len(prompt)) if self.ends else len(prompt)
        return len(self.ends) + (key not in self.ends), max(self.longest, end), shortest, key, end


def kept_cells(sequences: list[tuple[list[int], list[int]]], shared: bool) -> int:
    """``KeptCells`` of ``sequences`` (``shared``: in ``shared_rows``' layout)."""
    kept = KeptCells(shared)
    for prompt, response in sequences:
        kept.add(prompt, response)
    return kept.cells


def plain_rows(sequences: list[tuple[list[int], list[int]]], pad: int) -> Rows:
    """A row per response, left-padded so that every response ends in the last column, with
    position ids that count real tokens only. Column c predicts token c + 1: the last
    ``longest`` tokens are predicted by the ``longest`` columns before the last one."""
    width = max(len(p) + len(r) for p, r in sequences)
    longest = max(len(r) for _, r in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, (prompt, response) in enumerate(sequences):
        tokens = prompt + response
        ids[row, width - len(tokens) :] = torch.tensor(tokens)
        attention[row, width - len(tokens) :] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    where = [(row, torch.arange(longest - len(r), longest)) for row, (_, r) in enumerate(sequences)]
    return Rows(ids, attention, positions, longest + 1, where)


def shared_rows(sequences: list[tuple[list[int], list[int]]], pad: int, dtype: torch.dtype) -> Rows:
    """A row per distinct prompt, ``[prompt | response 1 | response 2 | ...]``, right-padded,
    with the 4-D mask and position ids of ``workers.shared_prompts``: each response sees the
    prompt and its own tokens, at the positions it was sampled at. A response's first token
    is predicted by its prompt's last column, each later one by the column before it.

    Example: prompt [1, 5] with responses [7, 9] and [8] -> one row [1, 5, 7, 9, 8]; kept
    columns from 1 (the prompt's last) on: [7, 9] from columns [0, 1], [8] from [0]."""
    rows: dict[tuple[int, ...], int] = {}
    prompts: list[int] = []
    ends: list[int] = []
    tokens: list[list[int]] = []
    segments: list[tuple[int, int, int]] = []
    absolute: list[tuple[int, list[int]]] = []
    for prompt, response in sequences:
        row = rows.setdefault(tuple(prompt), len(rows))
        if row == len(prompts):
            prompts.append(len(prompt))
            ends.append(len(prompt))
            tokens.append(list(prompt))
        column = ends[row]
        segments.append((row, column, len(response)))
        absolute.append((row, [prompts[row] - 1, *range(column, column + len(response) - 1)]))
        tokens[row] += response
        ends[row] += len(response)
    width = max(ends)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    for row, row_tokens in enumerate(tokens):
        ids[row, : len(row_tokens)] = torch.tensor(row_tokens)
    attention, positions = shared_prompt_attention(prompts, segments, width)
    start = min(prompts) - 1
    where = [(row, torch.tensor(columns) - start) for row, columns in absolute]
    return Rows(ids, attention, positions, width - start, where, dtype)
