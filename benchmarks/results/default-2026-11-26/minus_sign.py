"""How likely a model is to start its answer with a minus sign, on held-out questions whose
answer is below zero: the probability of the "-" token at the first response position under
the default job's prompt (and, for the base model, under system prompts that mention signs).

Run from the checkout's root:
``.venv/bin/python benchmarks/results/default-2026-11-26/minus_sign.py MODEL_OR_RUN_HF_DIR...``
(``smollm2-135m-instruct`` for the base model, ``runs/NAME/hf`` for a run's final model).
"""

from __future__ import annotations

import statistics
import sys

import torch

from streamrl.config import load_config, shipped_config
from streamrl.evaluation import eval_prompts
from streamrl.models import load_causal_lm, load_tokenizer, resolve_model


def first_token_minus(model, tokenizer, prompts: list, below_zero: bool) -> list[float]:
    """P("-") at the first response position for 12 of ``prompts`` whose answer is below zero
    (``below_zero``) or not."""
    chosen = [p for p in prompts if (int(p.ground_truth) < 0) == below_zero][:12]
    (minus,) = tokenizer.encode("-", add_special_tokens=False)
    out = []
    for prompt in chosen:
        ids = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True)
        ids = ids if isinstance(ids, list) else ids["input_ids"]
        with torch.no_grad():
            probs = model(torch.tensor([ids])).logits[0, -1].float().softmax(-1)
        out.append(float(probs[minus]))
    return out


def main() -> None:
    for name in sys.argv[1:]:
        model_dir = resolve_model(name)
        tokenizer = load_tokenizer(model_dir)
        model = load_causal_lm(model_dir, dtype="float32").eval()
        systems = [None]
        if name == "smollm2-135m-instruct":
            systems += [
                "Answer with the number only. It may be negative.",
                "Answer with the number only, with a minus sign if it is negative.",
            ]
        for system in systems:
            overrides = [f"data.system_prompt={system}"] if system else []
            prompts = eval_prompts(load_config(shipped_config("default"), overrides))
            below = first_token_minus(model, tokenizer, prompts, True)
            above = first_token_minus(model, tokenizer, prompts, False)
            print(
                f"{name} | system prompt {system or 'of the job'!r} | P('-' first): answers < 0 "
                f"median {statistics.median(below):.1e} [{min(below):.1e}-{max(below):.1e}], "
                f"answers >= 0 median {statistics.median(above):.1e}"
            )


if __name__ == "__main__":
    main()
