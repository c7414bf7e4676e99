"""An engine registered from outside streamrl, as a user registers theirs:
``generator.engine: engines_for_tests:RenamedHF`` (this module on the path). The contract suite
(``test_engine_contract.py``) holds it to the contract every built-in engine keeps.

It is the HF engine under another name and class, with options of its own: what a user's
engine needs is one module with an ``EngineKind`` subclass, and no line in streamrl.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from streamrl.workers.engines import EngineArgs, EngineKind
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.engines.options import HFOptions


class RenamedHFEngine(HFEngine):
    """The HF engine, built from options that are not the HF engine's."""


class RenamedOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Rows decoded together (the HF engine's max_batch_size); ``None``: every prompt at once.
    rows: Annotated[int, msgspec.Meta(ge=1)] | None = None


class RenamedHF(EngineKind):
    Options = RenamedOptions
    stepwise = seeded = True

    @classmethod
    def build(cls, args: EngineArgs, options: RenamedOptions) -> RenamedHFEngine:
        return RenamedHFEngine(args, HFOptions(max_batch_size=options.rows))
