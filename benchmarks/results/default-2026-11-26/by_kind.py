"""Right answers by kind (sums, differences >= 0, differences < 0) in final_evals.json (this
folder's, or the one in the folder given as the argument).

Run from the checkout's root: ``.venv/bin/python benchmarks/results/default-2026-11-26/by_kind.py``.
The held-out questions are the default job's (``streamrl.evaluation.eval_prompts``).
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

from streamrl.config import load_config, shipped_config
from streamrl.evaluation import eval_prompts


def main() -> None:
    questions = {p.prompt_id: p for p in eval_prompts(load_config(shipped_config("default")))}
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    evals = json.loads((folder / "final_evals.json").read_text())
    for model, result in evals.items():
        right: collections.Counter[str] = collections.Counter()
        total: collections.Counter[str] = collections.Counter()
        for sample in result["samples"]:
            text = questions[sample["prompt_id"]].messages[-1]["content"]
            op = re.search(r"\d+ ([+-]) \d+", text).group(1)
            below_zero = int(sample["ground_truth"]) < 0
            kind = "sum" if op == "+" else ("diff<0" if below_zero else "diff>=0")
            total[kind] += 1
            right[kind] += sample["exact"]
        print(model, {k: f"{right[k]}/{total[k]}" for k in ("sum", "diff>=0", "diff<0")})


if __name__ == "__main__":
    main()
