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

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

import numpy as np

from streamrl.workers.weight_codec import Undo, changed_elements


class EngineCopy:
    """The tensors whose engine copy mirrors the image, and each version's changed positions."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.mirrored: set[str] = set()

    def positions(
        self, records: list[Undo], names: Iterable[str], exclude: Collection[str] = ()
    ) -> Mapping[str, np.ndarray] | None:
        """For each of ``names`` the engine mirrors (and not in ``exclude``, tensors that also
        moved outside ``records``): the positions ``records`` wrote, worked out only for the
        tensors the engine asks for (a prepacked weight written in place never is). None
        when disabled."""
        if not self.enabled:
            return None
        wanted = {n for n in names if n in self.mirrored and n not in exclude}
        by_name: dict[str, list[Undo]] = {}
        for record in records:
            if record[0].header.name in wanted:
                by_name.setdefault(record[0].header.name, []).append(record)
        return _Positions(by_name)

    def on_adopt(self, names: Iterable[str]) -> Callable[[], None]:
        """The call that records, once an update is adopted, that the engine mirrors ``names``
        (each taken whole or by positions at that version)."""
        taken = set(names)

        def mark() -> None:
            if self.enabled:
                self.mirrored |= taken

        return mark


class _Positions(Mapping[str, np.ndarray]):
    """Per tensor, the positions its records wrote, decoded when first asked for; a tensor
    with a dense part has none (``changed_elements``)."""

    def __init__(self, by_name: dict[str, list[Undo]]) -> None:
        self._records = by_name
        self._decoded: dict[str, np.ndarray | None] = {}

    def _positions(self, name: str) -> np.ndarray | None:
        if name not in self._decoded:
            found = changed_elements(self._records.get(name, ()))
            self._decoded[name] = found.get(name)
        return self._decoded[name]

    def __getitem__(self, name: str) -> np.ndarray:
        found = self._positions(name) if name in self._records else None
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        return (n for n in self._records if self._positions(n) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)
