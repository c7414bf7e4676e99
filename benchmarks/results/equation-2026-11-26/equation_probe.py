"""How SmolLM2-135M-Instruct answers the default job's held-out questions (greedy, fp32), as a
bare reply and when its reply is made to start by restating the question ("a op b ="), and how
likely it is to write a minus sign first where the answer is below zero.

Run from the checkout's root:
``.venv/bin/python benchmarks/results/equation-2026-11-26/equation_probe.py``.
"""

from __future__ import annotations

import re
import statistics

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.config import load_config, shipped_config
from streamrl.evaluation import eval_prompts
from streamrl.models import resolve_model

path = resolve_model("smollm2-135m-instruct")
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
prompts = eval_prompts(load_config(shipped_config("default")))
minus_ids = [i for t, i in tokenizer.get_vocab().items() if t in ("-", "Ġ-")]
print(
    "cpu capability:",
    torch.backends.cpu.get_cpu_capability(),
    "| tokens of '19 - 16 = 3':",
    tokenizer.tokenize("19 - 16 = 3"),
)


def probe(restate: bool) -> None:
    right: dict[str, int] = {"sum": 0, "difference >= 0": 0, "difference < 0": 0}
    total = dict.fromkeys(right, 0)
    p_minus = []
    for prompt in prompts:
        a, op, b = re.search(r"(\d+) ([+-]) (\d+)", prompt.messages[-1]["content"]).groups()
        prefix = f"{a} {op} {b} =" if restate else ""
        text = tokenizer.apply_chat_template(
            prompt.messages, tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text + prefix, return_tensors="pt").input_ids
        with torch.no_grad():
            first = model(ids).logits[0, -1].softmax(-1)
            out = model.generate(ids, max_new_tokens=6, do_sample=False)
        reply = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        answer = re.match(r"\s*(-?\d+)", reply)
        truth = int(prompt.ground_truth)
        kind = "sum" if op == "+" else "difference >= 0" if truth >= 0 else "difference < 0"
        total[kind] += 1
        right[kind] += int(answer is not None and int(answer.group(1)) == truth)
        if truth < 0:
            p_minus.append(float(first[minus_ids].sum()))
    label = "after 'a op b ='" if restate else "bare reply     "
    print(
        f"{label}: right {right} of {total}; P(minus first | answer < 0) median "
        f"{statistics.median(p_minus):.2e}, range {min(p_minus):.1e}-{max(p_minus):.1e}"
    )


probe(restate=True)
probe(restate=False)
