"""Built-in tasks, procedurally generated, by name (``data.source`` / ``eval.source``;
docs/design.md §7): ``TASKS[name].question(data, seed, index, split)`` is a task's prompt
``index``, the same on every machine, from the training stream or the frozen held-out split
(``streamrl.tasks.base``); ``TASKS[name].exact`` is its held-out exact check.

- ``arithmetic``: ``What is 7 + 12?`` (the default job);
- ``chain``: ``What is 23 + 8 - 14 + 6?`` (``data.args.terms`` operands);
- ``countdown``: reach a target from ``data.args.numbers`` numbers with ``+ - * /``;
- ``gsm``: templated word problems, a worked solution ending in ``#### N``;
- ``guess``: a hidden number to find over several turns (``streamrl.envs.guess`` plays it);
- ``reasoning_gym:<name>``: any of reasoning-gym's generators, with its verifier
  (``streamrl.tasks.reasoning_gym``; ``task_for`` builds its Task).

A task's knobs are ``data.args``, decoded into its ``Task.args`` struct (e.g.
``ArithmeticArgs``) and checked before a run starts (``check_task_settings``, from
``data.check_data``).

Each module owns its task: the draw, the wording, the ground truth and the check of an
answer. They import only the config and the stdlib (and ``streamrl.data`` and
``streamrl.evaluation`` sit above them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrl.config import ConfigError
from streamrl.tasks import arithmetic, chain, countdown, gsm, guess
from streamrl.tasks.base import DataError, Task, task_args
from streamrl.tasks.reasoning_gym import dataset_for, gym_task, is_gym_source

if TYPE_CHECKING:
    from streamrl.config import Config

TASKS: dict[str, Task] = {
    task.name: task for task in (arithmetic.TASK, chain.TASK, countdown.TASK, gsm.TASK, guess.TASK)
}


def task_for(source: str) -> Task | None:
    """The generated task ``source`` names (a built-in one or ``reasoning_gym:<name>``), else
    None (a table: a file, a saved dataset or a hub dataset)."""
    if is_gym_source(source):
        return gym_task(source)
    return TASKS.get(source)


def check_task_settings(config: Config) -> None:
    """``ConfigError`` (one line) for a task's bad ``data.args``, args given to a table, and an
    unseen phrasing the arithmetic task trains on; run by ``data.check_data``."""
    data, ev = config.data, config.eval
    try:
        if is_gym_source(data.source):
            dataset_for(data, 0)
        elif data.source in TASKS:
            task_args(data, TASKS[data.source].args)
        elif data.args:
            raise ConfigError(
                f"data.args is for a built-in task or reasoning_gym:<task>; data.source="
                f"{data.source} is a table: map its rows with data.prompt_key, "
                "data.prompt_template, data.answer_key and data.answer_pattern"
            )
    except DataError as exc:
        raise ConfigError(str(exc)) from None
    if ev.source in ("", "arithmetic") and ev.unseen_phrasing and data.source == "arithmetic":
        args = task_args(data, arithmetic.ArithmeticArgs)
        if ev.unseen_phrasing in (args.question_template, *args.question_templates):
            raise ConfigError(
                "eval.unseen_phrasing must be a wording training never uses (it is one of "
                "data.args.question_template / question_templates)"
            )
