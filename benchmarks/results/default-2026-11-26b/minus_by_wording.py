"""P("-") at the first response position of the base model, for 10 held-out questions whose
answer is below zero, under each training wording of the default job and the eval's unseen one,
with and without the system prompt.

Run from the checkout's root:
``.venv/bin/python benchmarks/results/default-2026-11-26b/minus_by_wording.py [MODEL]``.
"""

from __future__ import annotations

import re
import statistics
import sys

import torch

from streamrl.config import load_config, shipped_config
from streamrl.evaluation import eval_prompts
from streamrl.models import load_causal_lm, load_tokenizer, resolve_model


def main() -> None:
    torch.set_num_threads(1)
    config = load_config(shipped_config("default"))
    prompts = [p for p in eval_prompts(config) if int(p.ground_truth) < 0][:10]
    model_dir = resolve_model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct")
    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype="float32").eval()
    (minus,) = tokenizer.encode("-", add_special_tokens=False)
    templates = ["What is {a} {op} {b}?", *config.data.question_templates, "Compute {a} {op} {b}."]
    for template in templates:
        for system in (config.data.system_prompt, ""):
            probs = []
            for prompt in prompts:
                a, op, b = re.search(r"(\d+) ([+-]) (\d+)", prompt.messages[-1]["content"]).groups()
                messages = [{"role": "system", "content": system}] if system else []
                messages.append({"role": "user", "content": template.format(a=a, op=op, b=b)})
                ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
                ids = ids if isinstance(ids, list) else ids["input_ids"]
                with torch.no_grad():
                    last = model(torch.tensor([ids])).logits[0, -1].float().softmax(-1)
                probs.append(float(last[minus]))
            median, top = statistics.median(probs), max(probs)
            print(f"{template!r:55} sys={bool(system)} P('-') median {median:.1e} max {top:.1e}")


if __name__ == "__main__":
    main()
