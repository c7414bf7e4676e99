"""A generative LLM judge as a reward scorer (``rewards: - judge: {...}``; ``JudgeSpec``).

A causal LM is asked about each response with ``spec.template`` (the user turn of its chat
template) and its answer becomes a score in [0, 1], or None where it gave none (the caller
counts those; they are never read as 0). Two ways, ``spec.score``:

- ``verdict``: one forward pass over the batch (left-padded, fp32 softmax at the last
  position): P(yes) / (P(yes) + P(no)), where P(yes) sums the next-token probabilities of the
  distinct first tokens of the ``yes`` spellings, and likewise for ``no``. Reading the
  distribution rather than a sampled word costs one forward and gives a graded score; a
  judge whose yes + no mass is below ``min_verdict_mass`` was about to say something else,
  so the item is unparsable (None). A first token that both lists share (a character
  tokenizer's leading space) says nothing about the verdict and counts for neither.
- ``number``: greedy generation on the project's engine (``spec.engine``: hf or vllm, built
  as a generator builds one), then ``parse_number`` on the decoded text: the first number,
  clamped into ``number_range`` and mapped linearly onto [0, 1].

Example: P(" Yes") = 0.6, P(" No") = 0.2, the rest elsewhere: verdict 0.75 (mass 0.8 passes
the default 0.05). "Score: 8/10" with number_range (0, 10): 0.8.

A judge prompt longer than the model's positions (``max_position_embeddings``, at most
``MAX_JUDGE_TOKENS``) is not cut, since a judge shown part of a question would still answer:
it scores None, counted as unparsable.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch

from streamrl.config import GeneratorConfig, JudgeSpec
from streamrl.models import has_chat_template, load_causal_lm, load_tokenizer, stop_token_ids
from streamrl.rewards.model import weights_hash
from streamrl.rewards.scorer import ScoreItem, scorer_identity
from streamrl.workers.engines import Engine, SamplingParams, make_engine

log = logging.getLogger(__name__)

# Judge prompt + generated tokens at most (the engine's max_model_len; positions beyond the
# model's own are never used).
MAX_JUDGE_TOKENS = 4096
# The first number in a text: optional sign, digits, optional decimals ("8/10" reads 8).
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def parse_number(text: str, low: float, high: float) -> float | None:
    """The first number in ``text`` clamped into [low, high] and mapped onto [0, 1]; None when
    the text holds no number. ``low < high`` (the config check holds it)."""
    found = _NUMBER.search(text)
    if found is None:
        return None
    value = min(max(float(found.group()), low), high)
    return (value - low) / (high - low)


def fill_template(template: str, item: ScoreItem) -> str:
    """The template's three fields filled by plain replacement, not ``str.format``: a response
    holding braces (code, LaTeX) would break or inject into a format string. One pass over the
    template: a field's value that itself reads ``{response}`` is left as it is."""
    fields = {
        "{prompt}": item.prompt,
        "{response}": item.response,
        "{ground_truth}": item.ground_truth,
    }
    pattern = re.compile("|".join(re.escape(f) for f in fields))
    return pattern.sub(lambda m: fields[m.group()], template)


class JudgeScorer:
    """The ``Scorer`` of one judge model (``streamrl.rewards.scorer``): ``score`` takes a batch of
    items and returns one float in [0, 1] or None per item, in order. ``compute_dtype`` is a
    torch dtype or its name (``hardware.resolve_compute_dtype``'s answer); ``batch_size`` caps
    the rows of one verdict forward and of one engine decode batch."""

    def __init__(
        self,
        spec: JudgeSpec,
        model_dir: Path,
        label: str,
        *,
        device: str = "cpu",
        compute_dtype: torch.dtype | str = torch.float32,
        seed: int = 0,
        batch_size: int = 16,
    ) -> None:
        self.spec, self.device, self.batch_size = spec, device, batch_size
        self.tokenizer = load_tokenizer(model_dir)
        self.weights_hash = weights_hash(model_dir)
        self.identity = scorer_identity(label, self.weights_hash)
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self.max_tokens = min(config.get("max_position_embeddings") or 2048, MAX_JUDGE_TOKENS)
        dtype_name = str(compute_dtype).removeprefix("torch.")
        self.model: torch.nn.Module | None = None
        self.engine: Engine | None = None
        if spec.score == "verdict":
            self.yes_ids, self.no_ids = self._verdict_tokens(label)
            self.model = load_causal_lm(model_dir, dtype=dtype_name, device=device).eval()
        else:
            gen = GeneratorConfig(
                engine=spec.engine,
                device=device,
                temperature=0.0,
                max_new_tokens=spec.max_new_tokens,
                engine_options={"max_batch_size": batch_size},
            )
            self.engine = make_engine(
                gen, model_dir, seed=seed, compute_dtype=dtype_name, max_model_len=self.max_tokens
            )

    def score(self, items: list[ScoreItem]) -> list[float | None]:
        prompts = [self._encode(item) for item in items]
        if self.spec.score == "verdict":
            return self._verdicts(prompts)
        return self._numbers(prompts)

    def shutdown(self) -> None:
        """Release the engine (vLLM holds processes and memory); a verdict judge holds none."""
        if self.engine is not None:
            self.engine.shutdown()

    # ----------------------------------------------------------------------------- prompts

    def _encode(self, item: ScoreItem) -> list[int]:
        """The judge prompt's token ids: the chat template's user turn with the generation
        prompt, or the text as it is (with the tokenizer's own special tokens) without one."""
        text = fill_template(self.spec.template, item)
        if has_chat_template(self.tokenizer):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if not isinstance(ids, list):  # newer transformers return a BatchEncoding
                ids = ids["input_ids"]
        else:
            ids = self.tokenizer(text)["input_ids"]
        return list(ids)

    def _verdict_tokens(self, label: str) -> tuple[list[int], list[int]]:
        """The distinct first token ids of the yes and no spellings. A spelling that encodes
        to nothing or to the unknown token is refused here, not read as a zero probability
        for every item later; a first token both lists share counts for neither."""
        firsts: dict[str, set[int]] = {}
        for side in ("yes", "no"):
            firsts[side] = set()
            for spelling in getattr(self.spec, f"{side}_tokens"):
                ids = self.tokenizer.encode(spelling, add_special_tokens=False)
                unk = self.tokenizer.unk_token_id
                if not ids or (unk is not None and unk in ids):
                    raise ValueError(
                        f"judge {label}: the {side} spelling {spelling!r} cannot be encoded by "
                        f"its tokenizer; give spellings its vocabulary holds"
                    )
                firsts[side].add(ids[0])
        shared = firsts["yes"] & firsts["no"]
        yes, no = sorted(firsts["yes"] - shared), sorted(firsts["no"] - shared)
        if not yes or not no:
            raise ValueError(
                f"judge {label}: the yes and no spellings begin with the same tokens "
                f"{sorted(shared)}; give spellings whose first tokens differ"
            )
        if shared:
            log.info(
                "judge %s: first tokens %s begin both yes and no: counted for neither",
                label,
                sorted(shared),
            )
        return yes, no

    # ----------------------------------------------------------------------------- verdict

    @torch.no_grad()
    def _verdicts(self, prompts: list[list[int]]) -> list[float | None]:
        scores: list[float | None] = [None] * len(prompts)
        fits = [i for i, p in enumerate(prompts) if len(p) <= self.max_tokens]
        for start in range(0, len(fits), self.batch_size):
            rows = fits[start : start + self.batch_size]
            probs = self._next_token_probs([prompts[i] for i in rows])
            yes = probs[:, self.yes_ids].sum(-1)
            no = probs[:, self.no_ids].sum(-1)
            for i, y, n in zip(rows, yes.tolist(), no.tolist(), strict=True):
                if y + n >= self.spec.min_verdict_mass and y + n > 0:
                    scores[i] = y / (y + n)
        return scores

    def _next_token_probs(self, prompts: list[list[int]]) -> torch.Tensor:
        """[B, V] fp32 next-token probabilities after each prompt: rows left-padded so every
        last position is the final column, the mask hiding the padding and the positions
        counting real tokens only, so a row scores as it would alone (the tests hold 1e-4)."""
        assert self.model is not None
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
            logits_to_keep=1,  # the last position's logits only, not a [B, T, V] projection
        ).logits[:, -1]
        return torch.softmax(logits.float(), dim=-1).cpu()

    # ----------------------------------------------------------------------------- number

    def _numbers(self, prompts: list[list[int]]) -> list[float | None]:
        assert self.engine is not None
        params = SamplingParams(
            temperature=0.0,
            max_new_tokens=self.spec.max_new_tokens,
            stop_token_ids=stop_token_ids(self.tokenizer),
        )
        room = self.max_tokens - self.spec.max_new_tokens
        fits = [i for i, p in enumerate(prompts) if len(p) <= room]
        scores: list[float | None] = [None] * len(prompts)
        if not fits:
            return scores
        outputs = self.engine.generate([prompts[i] for i in fits], params)
        low, high = self.spec.number_range
        for i, out in zip(fits, outputs, strict=True):
            text = self.tokenizer.decode(out.response_ids, skip_special_tokens=True)
            scores[i] = parse_number(text, low, high)
        return scores
