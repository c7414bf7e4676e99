"""``workers.generation.evaluator.evaluate``: an engine's responses, scored by
``streamrl.evaluation``."""

from __future__ import annotations

from streamrl.config import load_config
from streamrl.evaluation import eval_prompts
from streamrl.workers.engines.base import GenerationOutput, SamplingParams
from streamrl.workers.generation.evaluator import evaluate


class _Tokenizer:
    """Prompts as one token per message; a response's ids are the characters of its text."""

    eos_token_id, unk_token_id = 0, 1
    chat_template = "messages"  # has one: prompts go through apply_chat_template

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.unk_token_id

    def apply_chat_template(self, messages, add_generation_prompt: bool, tokenize: bool):
        return [2] * len(messages)

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return "".join(map(chr, ids))


class _Engine:
    """Answers every prompt right on its first sample and wrong on the others."""

    version = 7

    def __init__(self, answers: list[str], samples: int) -> None:
        self.answers, self.samples = answers, samples
        self.params: SamplingParams | None = None

    def generate(self, batch: list[list[int]], params: SamplingParams) -> list[GenerationOutput]:
        self.params = params
        texts = [
            self.answers[i // self.samples] if i % self.samples == 0 else "no idea"
            for i in range(len(batch))
        ]
        return [GenerationOutput([ord(c) for c in t], [], [7] * len(t), "stop") for t in texts]


def test_evaluate_scores_every_sample_of_every_prompt() -> None:
    config = load_config("configs/tiny.yaml", ["eval.max_prompts=3", "eval.samples=2"])
    prompts = eval_prompts(config)
    engine = _Engine([p.ground_truth for p in prompts], samples=2)
    result = evaluate(engine, _Tokenizer(), config, prompts)
    assert engine.params is not None and engine.params.stop_token_ids == (0,)
    assert engine.params.temperature == config.eval.temperature
    assert result.version == 7 and len(result.samples) == 6
    assert result.metrics["eval/exact_match"] == 0.5
    assert result.metrics["eval/pass_at_k"] == 1.0
    assert result.metrics["eval/prompts"] == 3.0
    assert [s["exact"] for s in result.samples] == [True, False] * 3
