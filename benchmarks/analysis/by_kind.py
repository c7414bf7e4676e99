"""Right answers by kind of question (sums, differences >= 0, differences < 0) in the JSON that
``streamrl eval MODEL_OR_RUN... --out FILE`` writes, one line per model in it.

The kind is read from each question's text, which the JSON does not hold: it is looked up by
``prompt_id`` in the held-out prompts of ``--config`` (the default job's unless given), so run
this at the commit that wrote the JSON (held-out draws change between commits).

    streamrl eval runs/NAME --out evals.json
    .venv/bin/python benchmarks/analysis/by_kind.py evals.json [MORE.json] [--config CONFIG]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

from streamrl.config import load_config, shipped_config
from streamrl.evaluation import eval_prompts

KINDS = ("sum", "diff>=0", "diff<0")


def kind_of(question: str, ground_truth: str) -> str:
    """``sum`` for ``a + b``, else ``diff<0`` or ``diff>=0`` by the answer's sign."""
    match = re.search(r"\d+ ([+-]) \d+", question)
    if match is None:
        raise ValueError(f"not an arithmetic question: {question!r}")
    if match.group(1) == "+":
        return "sum"
    return "diff<0" if int(ground_truth) < 0 else "diff>=0"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("evals", nargs="+", type=Path, help="JSON from `streamrl eval --out`")
    parser.add_argument("--config", help="the job whose held-out prompts were evaluated")
    args = parser.parse_args()
    config = load_config(args.config or shipped_config("default"))
    prompts = {p.prompt_id: p for p in eval_prompts(config)}
    for path in args.evals:
        for model, result in json.loads(path.read_text()).items():
            right: collections.Counter[str] = collections.Counter()
            total: collections.Counter[str] = collections.Counter()
            for sample in result["samples"]:
                prompt = prompts.get(sample["prompt_id"])
                if prompt is None or prompt.ground_truth != sample["ground_truth"]:
                    print(
                        f"{path}: {sample['prompt_id']} is not the held-out question it was "
                        "when the file was written; run at that commit",
                        file=sys.stderr,
                    )
                    return 2
                kind = kind_of(prompt.messages[-1]["content"], sample["ground_truth"])
                total[kind] += 1
                right[kind] += bool(sample["exact"])
            print(model, {k: f"{right[k]}/{total[k]}" for k in KINDS})
    return 0


if __name__ == "__main__":
    sys.exit(main())
