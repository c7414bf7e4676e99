"""How a model answers the default job's held-out questions in two forms, greedy, fp32: as a
bare reply, and with its reply made to start by restating the question ("a op b ="). Per kind
of question (sums, differences >= 0, differences < 0): how many it gets right, and where the
answer is below zero, how likely it is to write a minus sign first.

It is why the default job rewards a restatement (``equation_form``): SmolLM2-135M-Instruct
computes far better after "19 - 16 =" than as a bare number.

    .venv/bin/python benchmarks/analysis/answer_form.py [--model smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import re
import statistics

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.config import load_config, shipped_config
from streamrl.evaluation import eval_prompts
from streamrl.models import resolve_model

NEW_TOKENS = 6


def probe(model, tokenizer, prompts: list, restate: bool) -> None:
    minus_ids = [i for t, i in tokenizer.get_vocab().items() if t in ("-", "Ġ-")]
    right = {"sum": 0, "difference >= 0": 0, "difference < 0": 0}
    total = dict.fromkeys(right, 0)
    p_minus = []
    for prompt in prompts:
        a, op, b = re.search(r"(\d+) ([+-]) (\d+)", prompt.messages[-1]["content"]).groups()
        text = tokenizer.apply_chat_template(
            prompt.messages, tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text + (f"{a} {op} {b} =" if restate else ""), return_tensors="pt")
        ids = ids.input_ids
        with torch.no_grad():
            first = model(ids).logits[0, -1].float().softmax(-1)
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        reply = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        answer = re.match(r"\s*(-?\d+)", reply)
        truth = int(prompt.ground_truth)
        kind = "sum" if op == "+" else "difference >= 0" if truth >= 0 else "difference < 0"
        total[kind] += 1
        right[kind] += int(answer is not None and int(answer.group(1)) == truth)
        if truth < 0:
            p_minus.append(float(first[minus_ids].sum()))
    label = "after 'a op b ='" if restate else "bare reply     "
    spread = (
        f"median {statistics.median(p_minus):.2e}, range {min(p_minus):.1e}-{max(p_minus):.1e}"
        if p_minus
        else "no such question"
    )
    print(f"{label}: right {right} of {total}; P(minus first | answer < 0) {spread}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--config", help="the job whose held-out questions to ask")
    args = parser.parse_args()
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = eval_prompts(load_config(args.config or shipped_config("default")))
    print("cpu capability:", torch.backends.cpu.get_cpu_capability())
    probe(model, tokenizer, prompts, restate=True)
    probe(model, tokenizer, prompts, restate=False)


if __name__ == "__main__":
    main()
