"""``reasoning_gym:<name>``: prompts and verifiers from reasoning-gym (``pip install
'streamrl[gym]'``), e.g. ``reasoning_gym:gsm_symbolic`` or ``reasoning_gym:countdown``.

reasoning-gym's generators are procedural: ``create_dataset(name, seed=s, size=n, **args)[i]``
is a fixed ``{question, answer, metadata}`` entry, and ``get_score_answer_fn(name)(answer,
entry)`` its verifier (1.0 right; some tasks give part credit). ``data.args`` are the
generator's keyword arguments. Question ``index`` of a run's stream draws entries from the
dataset seeded by the run's seed, and the held-out split is one question in
``data.holdout_every`` by a hash of its text, as for the built-in tasks
(``streamrl.tasks.base.draw``), so evaluation (seeded by ``eval.seed``) never asks a question
training drew.

A prompt carries its entry (``Prompt.metadata``), so the ``reasoning_gym`` reward and the
held-out check score a response with the task's own verifier in the process that sampled it.
The answer is read from the response's last ``<answer>...</answer>`` (reasoning-gym's format,
asked for by its default system prompt), else from its last non-empty line, or its first
(``answer="first_line"``: for a job whose system prompt asks for the answer alone, where what
follows the first line is a small model's rambling, often cut at the token limit), without a
trailing ``= ...`` with ``strip_equation`` (an expression's stated value: countdown's answer is
the expression).
"""

from __future__ import annotations

import functools
import json
import random
import re
from typing import Any

from streamrl.config import DataConfig
from streamrl.tasks.base import DataError, Prompt, Task, draw, messages, system_prompt

PREFIX = "reasoning_gym:"
# Entries per generator: question i of a stream draws one of them at random, so that the
# stream's questions do not repeat within any run's length.
SIZE = 1 << 24
# reasoning-gym's default instruction (reasoning_gym.utils.SYSTEM_PROMPTS["default"]).
DEFAULT_PROMPT = "default"


def _require() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise DataError(
            "data.source reasoning_gym:<task> needs reasoning-gym: pip install 'streamrl[gym]'"
        ) from None
    return reasoning_gym


@functools.lru_cache(maxsize=16)
def _dataset(name: str, args_json: str, seed: int) -> Any:
    gym = _require()
    try:
        return gym.create_dataset(name, seed=seed, size=SIZE, **json.loads(args_json))
    except Exception as exc:  # an unknown name or bad arguments raise several types
        known = ""
        if "not registered" in str(exc) or isinstance(exc, KeyError):
            known = " (reasoning_gym.factory.DATASETS lists the tasks)"
        raise DataError(f"data.source {PREFIX}{name}: {exc}{known}") from None


def dataset_for(data: DataConfig, seed: int) -> Any:
    """The reasoning-gym dataset of ``data.source``, seeded by ``seed``."""
    name = data.source.removeprefix(PREFIX)
    return _dataset(name, json.dumps(data.args, sort_keys=True), seed)


def _default_system_prompt() -> str:
    return _require().utils.SYSTEM_PROMPTS[DEFAULT_PROMPT]


def gym_question(config: DataConfig, seed: int, index: int, split: str = "train") -> Prompt:
    """Question ``index`` of the seeded stream of ``split`` (module doc)."""
    dataset = dataset_for(config, seed)
    rng = random.Random(f"{config.source}:{seed}:{index}")

    def make(rng: random.Random) -> tuple[str, dict[str, Any]]:
        entry = dataset[rng.randrange(SIZE)]
        return entry["question"], entry

    key, entry = draw(rng, split, config.holdout_every, make)
    name = config.source.removeprefix(PREFIX)
    system = system_prompt(config, _default_system_prompt())
    return Prompt(
        f"{name}-{index}",
        messages(system, entry["question"]),
        str(entry["answer"]),
        config.source,
        key,
        metadata={"reasoning_gym": name, "entry": entry},
        # The entry's own answer, which its verifier accepts (countdown: one expression).
        reference=str(entry["answer"]),
    )


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def response_answer(response: str, answer: str = "last_line", strip_equation: bool = False) -> str:
    """The answer a response gives (module doc): its last ``<answer>`` tag's content, else its
    last (or with ``answer="first_line"``, first) non-empty line; ``strip_equation`` drops a
    trailing ``= ...`` (``"3 * 7 - 6 = 15"`` -> ``"3 * 7 - 6"``)."""
    tagged = _ANSWER.findall(response)
    if tagged:
        text = tagged[-1].strip()
    else:
        lines = [line.strip() for line in response.splitlines() if line.strip()]
        text = (lines[0] if answer == "first_line" else lines[-1]) if lines else ""
    if strip_equation:
        text = text.split("=", 1)[0].strip()
    return text.strip("`").strip()


ANSWER_MODES = ("last_line", "first_line")


def score(
    response: str,
    metadata: dict[str, Any] | None,
    answer: str = "last_line",
    strip_equation: bool = False,
) -> float:
    """The task's own verifier on ``response`` (0.0 for a prompt that is not reasoning-gym's,
    or a verifier that raises: a model's malformed answer is wrong, never an error)."""
    if answer not in ANSWER_MODES:
        raise ValueError(f"answer must be one of {', '.join(ANSWER_MODES)}, not {answer!r}")
    if not metadata or "reasoning_gym" not in metadata:
        return 0.0
    scorer = _require().get_score_answer_fn(metadata["reasoning_gym"])
    text = response_answer(response, answer, strip_equation)
    try:
        return float(scorer(text, metadata["entry"]) or 0.0)
    except Exception:  # the verifier's own parse of a malformed answer
        return 0.0


def is_gym_source(source: str) -> bool:
    return source.startswith(PREFIX)


@functools.lru_cache(maxsize=16)
def gym_task(source: str) -> Task:
    """The Task of ``reasoning_gym:<name>``; its held-out check is the verifier's full score
    (the response is scored with the prompt's entry by ``evaluation.exact_answer``)."""
    return Task(source, gym_question)
