"""A second copy of an engine's parameters that takes a version by its changed elements
(docs/design.md §4), so the adoption between decode steps stays a pointer swap.

About 1-3% of a version's bf16 elements change. An engine whose parameters are not the weight
thread's image (fp32 on an AVX2 CPU, a GPU's, the tensors a forward reads beside a shared
image) used to make each changed parameter anew from the image: the whole model converted or
moved each version. Here each such parameter has a spare no forward reads. The weight thread
writes the version's changed elements into the spare, and the adoption swaps spare and live.

The spare lags the live tensor by what the live one took last (``lag``). Preparing writes
``lag`` and the new positions, both read from the image at the new version. After the swap,
the old live tensor is the spare, and it lacks exactly the positions just taken.

Example: live holds v4; the spare, v3 (``lag`` = v4's positions). Preparing v5 writes v4's
and v5's positions from the image into the spare (now v5); the swap makes it live, and the
old live (v4) becomes the spare with ``lag`` = v5's positions.

A spare written but never swapped in (an update prepared, then dropped) keeps its positions
in ``lag``, so the next preparation writes them again. A parameter replaced whole drops its
spare; the next one by positions clones the live tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from streamrl.workers.weight_codec import ChangedElements, as_i16

# Flat positions: an int64 array, or what ``np.asarray`` makes one of (with its ``size``).
Positions = np.ndarray | ChangedElements

# Above this share of a tensor's elements to write, one streaming copy of the whole tensor
# into the spare is cheaper than writing them one by one: a scattered write costs ~20 ns an
# element against ~0.6 ns copied. SmolLM2-135M in fp32, one thread, AVX2 as emulated on an
# Intel Xeon (``benchmarks/engine_copy.py``): the last version's and this one's positions
# scattered 32 / 55 / 117 ms at 0.5 / 1 / 2.5% changed a version, a copy 74-79 ms, new
# tensors (what the engine made before) 86-95 ms, page faults and all.
SCATTER_SHARE = 0.03


@dataclass
class _Spare:
    tensor: torch.Tensor
    # Positions it may differ from live (arrays, or ``ChangedElements`` not yet decoded).
    lag: list[Positions] = field(default_factory=list)


class SpareCopies:
    """Per parameter name, the spare that takes versions by positions (module doc)."""

    def __init__(self) -> None:
        self._spares: dict[str, _Spare] = {}

    def positions_for(
        self,
        name: str,
        source: torch.Tensor,
        param: torch.Tensor,
        positions: Mapping[str, Positions] | None,
    ) -> Positions | None:
        """``positions[name]`` where taking just those is right: a bf16 host image of the
        same shape, both contiguous."""
        where = None if positions is None else positions.get(name)
        if where is None or source.shape != param.shape or source.dtype != torch.bfloat16:
            return None
        if source.device.type != "cpu":
            return None
        if not (source.is_contiguous() and param.is_contiguous()):
            return None
        return where

    def write(self, name: str, param: torch.Tensor, source: torch.Tensor, where: Positions):
        """Bring ``name``'s spare to ``source`` (the image, one version past what ``param``
        holds, differing from it at ``where``) off the decode path; returns the swap that
        makes it live, for the adoption."""
        spare = self._spares.get(name)
        if spare is None:
            spare = self._spares[name] = _Spare(param.detach().clone())
        spare.lag.append(where)  # before writing: a spare never swapped in keeps them
        if sum(p.size for p in spare.lag) > SCATTER_SHARE * param.numel():
            spare.tensor.copy_(source)  # dense enough: one streaming pass is cheaper
        else:
            for positions in spare.lag:
                write_at(positions, source, spare.tensor)

        def swap() -> None:
            live = param.data
            param.data = spare.tensor
            spare.tensor, spare.lag = live, [where]

        return swap

    def drop(self, name: str) -> None:
        """``name``'s live tensor changed another way (whole): its spare no longer follows."""
        self._spares.pop(name, None)


def write_at(where: Positions, source: torch.Tensor, target: torch.Tensor) -> None:
    """``target``'s elements at ``where`` from ``source`` (bf16 on the host)."""
    positions = np.asarray(where)
    if target.device.type == "cpu" and target.dtype in (torch.bfloat16, torch.float32):
        # Imported here: numba loads only where versions are applied.
        from streamrl.workers.diff_kernels import copy_at

        bits = torch.int16 if target.dtype == torch.bfloat16 else torch.int32
        view = np.uint16 if target.dtype == torch.bfloat16 else np.uint32
        copy_at(positions, as_i16(source), target.view(bits).reshape(-1).numpy().view(view))
        return
    index = torch.from_numpy(positions)
    values = source.reshape(-1).index_select(0, index).to(target.device, target.dtype)
    target.view(-1).index_copy_(0, index.to(target.device), values)
