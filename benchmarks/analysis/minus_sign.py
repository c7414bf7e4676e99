"""How likely a model is to start its answer with a minus sign where the answer is below zero:
P("-") at the first response position on 12 held-out questions of the default job whose answer
is below zero (and, for contrast, 12 whose answer is not), greedy, fp32.

A policy that (almost) never samples "-" first cannot learn those questions: every group on
one scores alike, is dropped for zero variance and teaches nothing.

    .venv/bin/python benchmarks/analysis/minus_sign.py smollm2-135m-instruct runs/NAME/hf
    .venv/bin/python benchmarks/analysis/minus_sign.py smollm2-135m-instruct --systems \\
        "Answer with the number only. It may be negative."
    .venv/bin/python benchmarks/analysis/minus_sign.py smollm2-135m-instruct --wordings

``--systems`` adds system prompts to try; ``--wordings`` asks each question in every training
wording of the job, the eval's and an unseen one, with and without the system prompt.
"""

from __future__ import annotations

import argparse
import re
import statistics

import torch

from streamrl.config import load_config, shipped_config
from streamrl.evaluation import eval_prompts
from streamrl.models import load_causal_lm, load_tokenizer, resolve_model
from streamrl.tasks.arithmetic import SYSTEM_PROMPT
from streamrl.tasks.base import system_prompt

UNSEEN_WORDING = "Compute {a} {op} {b}."
EVAL_WORDING = "What is {a} {op} {b}?"
QUESTIONS = 12


def p_minus_first(model, tokenizer, conversations: list[list[dict]]) -> list[float]:
    """P("-") at the first response position of each conversation."""
    (minus,) = tokenizer.encode("-", add_special_tokens=False)
    out = []
    for messages in conversations:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = ids if isinstance(ids, list) else ids["input_ids"]
        with torch.no_grad():
            probs = model(torch.tensor([ids])).logits[0, -1].float().softmax(-1)
        out.append(float(probs[minus]))
    return out


def summary(probs: list[float]) -> str:
    return f"median {statistics.median(probs):.1e} [{min(probs):.1e}-{max(probs):.1e}]"


def reworded(prompt, template: str, system: str | None) -> list[dict]:
    a, op, b = re.search(r"(\d+) ([+-]) (\d+)", prompt.messages[-1]["content"]).groups()
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": template.format(a=a, op=op, b=b)}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="a built-in name or an HF directory")
    parser.add_argument("--config", help="the job whose held-out questions to ask")
    parser.add_argument("--systems", nargs="*", default=[], help="system prompts to try too")
    parser.add_argument("--wordings", action="store_true", help="every wording of the job")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config_path = args.config or shipped_config("default")
    config = load_config(config_path)
    prompts = eval_prompts(config)  # the job's own system prompt and wording
    below = [p for p in prompts if int(p.ground_truth) < 0][:QUESTIONS]
    for name in args.models:
        model_dir = resolve_model(name)
        tokenizer = load_tokenizer(model_dir)
        model = load_causal_lm(model_dir, dtype="float32").eval()
        if args.wordings:
            wordings = config.data.args.get("question_templates", [])
            templates = [EVAL_WORDING, *wordings, UNSEEN_WORDING]
            own_system = system_prompt(config.data, SYSTEM_PROMPT)
            for template in templates:
                for system in (own_system, None):
                    probs = p_minus_first(
                        model, tokenizer, [reworded(p, template, system) for p in below]
                    )
                    print(
                        f"{name} | {template!r} system={bool(system)} | P('-' first), "
                        f"answers < 0: {summary(probs)}"
                    )
            continue
        for system in [None, *args.systems]:
            overrides = [f"data.system_prompt={system}"] if system else []
            asked = eval_prompts(load_config(config_path, overrides))
            neg = [p.messages for p in asked if int(p.ground_truth) < 0][:QUESTIONS]
            pos = [p.messages for p in asked if int(p.ground_truth) >= 0][:QUESTIONS]
            neg_probs = p_minus_first(model, tokenizer, neg)
            pos_probs = p_minus_first(model, tokenizer, pos)
            print(
                f"{name} | system prompt {system or 'of the job'!r} | P('-' first): answers < 0 "
                f"{summary(neg_probs)}, answers >= 0 median {statistics.median(pos_probs):.1e}"
            )


if __name__ == "__main__":
    main()
