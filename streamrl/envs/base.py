"""What an environment is: a multi-turn counterpart of the policy (docs/design.md §7).

An episode starts from a prompt record (``reset``); each policy turn's text goes to ``step``,
which answers with the next observation (a user turn the chat template renders), the reward
of that step and whether the episode is over. ``streamrl.workers.generation.episodes`` drives many
episodes at once over an engine and keeps the exact tokens of both sides.

A new environment instance serves each episode, so an environment keeps its episode's state
in ``self``. Environments run in the generator's process (a step is a parse and a little
arithmetic: a process per episode would cost more than the step); ``step`` runs on a worker
thread with ``env.step_timeout_s``, and a step that raises or hangs ends its episode with
finish reason ``error``, never the generator. An environment that is slow, or unsafe to run
in the generator (arbitrary code, a sandbox), starts its own process from ``reset`` and talks
to it from ``step``.

Example (a user's environment, named in a config as ``env.name: mypkg.envs:Echo``)::

    class Echo(Environment):
        def reset(self, prompt):
            self.truth = prompt.ground_truth
        def step(self, text):
            if self.truth in text:
                return StepResult(reward=1.0, done=True, success=True)
            return StepResult(observation="No. Try again.")
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from streamrl.tasks.base import Prompt


@dataclass
class StepResult:
    # The environment's answer, rendered as the next user turn ("" when ``done``).
    observation: str = ""
    reward: float = 0.0
    done: bool = False
    # With ``done``: the task was solved (the held-out success rate counts these).
    success: bool = False
    # Non-empty: the episode ends here, abnormally, for this reason (e.g. a malformed tool
    # call); counted by reason in ``/status`` and ``summary.json``.
    error: str = ""
    # Counts this step adds to the episode's figures (e.g. ``{"tool_calls": 1}``).
    counts: dict[str, float] = field(default_factory=dict)


class Environment(ABC):
    """One episode's counterpart (module doc). ``__init__`` takes the config's ``env.args``
    as keyword arguments."""

    # Non-empty: the episode's system prompt, in place of its task's. A tool's protocol
    # belongs to the environment that serves the tool, whatever task the questions come from.
    instructions: str = ""
    # Messages shown before the episode's question (e.g. one worked exchange with the tool):
    # a small model imitates a demonstration far sooner than it follows a description.
    examples: tuple[dict[str, str], ...] = ()

    @abstractmethod
    def reset(self, prompt: Prompt) -> None:
        """Start an episode on ``prompt`` (its messages are the episode's first turn)."""

    @abstractmethod
    def step(self, text: str) -> StepResult:
        """The policy's turn ``text`` (decoded, special tokens removed) -> the result."""
