"""Built-in tasks, procedurally generated, by name (``data.source`` / ``eval.source``;
docs/design.md §7): ``TASKS[name].question(data, seed, index, split)`` is a task's prompt
``index``, the same on every machine, from the training stream or the frozen held-out split
(``streamrl.tasks.base``); ``TASKS[name].exact`` is its held-out exact check.

- ``arithmetic``: ``What is 7 + 12?`` (the default job);
- ``chain``: ``What is 23 + 8 - 14 + 6?`` (``data.chain_terms`` operands);
- ``countdown``: reach a target from ``data.countdown_numbers`` numbers with ``+ - * /``;
- ``gsm``: templated word problems, a worked solution ending in ``#### N``;
- ``guess``: a hidden number to find over several turns (``streamrl.envs.guess`` plays it).

Each module owns its task: the draw, the wording, the ground truth and the check of an
answer. They import only the config and the stdlib (and ``streamrl.data`` and
``streamrl.evaluation`` sit above them).
"""

from __future__ import annotations

from streamrl.tasks import arithmetic, chain, countdown, gsm, guess
from streamrl.tasks.base import Task

TASKS: dict[str, Task] = {
    task.name: task for task in (arithmetic.TASK, chain.TASK, countdown.TASK, gsm.TASK, guess.TASK)
}
