"""Pure-torch RL algorithms: advantages, policy/value losses, KL penalties, reward shaping,
and the entropy coefficient's control (``entropy``, plain Python).

Config strings select implementations from small registries:

- ``advantages.ADVANTAGES``: ``grpo``, ``dr_grpo``, ``rloo`` (GAE is ``advantages.gae``)
- ``losses.CORRECTIONS``: ``none``, ``token-tis``, ``seq-tis``, ``token-mask``, ``seq-mask``
- ``losses.AGGREGATIONS``: ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum``,
  ``seq-mean-token-sum-norm``
- ``kl.KL_ESTIMATORS``: ``k1``, ``abs``, ``k2``, ``k3``

Submodules load lazily (PEP 562), so ``streamrl.algorithms.group_filter``, which the torch-free
buffer imports, does not pull in torch. See docs/algorithms.md for formulas and how to choose.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamrl.algorithms import advantages, kl, losses, rewards
    from streamrl.algorithms.advantages import ADVANTAGES
    from streamrl.algorithms.kl import KL_ESTIMATORS
    from streamrl.algorithms.losses import AGGREGATIONS, CORRECTIONS

_SUBMODULES = {"advantages", "kl", "losses", "rewards"}
_NAMES = {
    "ADVANTAGES": "advantages",
    "AGGREGATIONS": "losses",
    "CORRECTIONS": "losses",
    "KL_ESTIMATORS": "kl",
}

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CORRECTIONS",
    "KL_ESTIMATORS",
    "advantages",
    "kl",
    "losses",
    "rewards",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
