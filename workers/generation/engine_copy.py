"""Which elements of the weight thread's image the engine's own copy lacks (docs/design.md §4).

About 1% of a version's bf16 elements change. An engine that keeps its own copy of the weights
(fp32 on an AVX2 CPU, a GPU's, the tensors a forward reads beside a shared image) and says
``takes_positions`` can then take just the changed elements of each tensor
(``Engine.prepare_weights``'s ``positions``) instead of converting or moving every tensor
whole. The positions come from the undo records of the parts the subscriber applied
(``weight_codec.changed_elements``).

That is right only for a tensor whose engine copy already equals the image at the engine's
version, so a tensor is given by positions only once it was taken whole at an adopted version
(``mirrored``): the engine loads its weights from the model directory, which may hold other
values (fp32 weights the image rounded), and an update prepared but never adopted leaves the
copy where it was. Example: v1 reaches the engine whole (every tensor is new to it); from v2
on each tensor goes by its changed positions; a tensor the evaluation process let through
several versions unprepared (``exclude``) goes whole again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from streamrl.workers.weight_codec import ChangedElements, Undo, changed_elements


class EngineCopy:
    """The tensors whose engine copy mirrors the image, and each version's changed positions."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.mirrored: set[str] = set()

    def positions(
        self, records: list[Undo], names: Iterable[str], exclude: Collection[str] = ()
    ) -> Mapping[str, ChangedElements] | None:
        """For each of ``names`` the engine mirrors (and not in ``exclude``, tensors that also
        moved outside ``records``): what ``records`` wrote (its positions decoded only if the
        engine asks for them). None when disabled."""
        if not self.enabled:
            return None
        wanted = {n for n in names if n in self.mirrored and n not in exclude}
        return changed_elements(r for r in records if r[0].header.name in wanted)

    def on_adopt(self, names: Iterable[str]) -> Callable[[], None]:
        """The call that records, once an update is adopted, that the engine mirrors ``names``
        (each taken whole or by positions at that version)."""
        taken = set(names)

        def mark() -> None:
            if self.enabled:
                self.mirrored |= taken

        return mark
