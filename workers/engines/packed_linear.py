"""Linear layers with oneDNN-prepacked bf16 weights, for CPU decoding.

A plain bf16 ``F.linear`` on CPU reorders its weight into oneDNN's blocked layout on every
call. A decode step is a handful of rows against every weight of the model, so that reorder is
a large part of it: SmolLM2's [16, 576] x [576, 1536] projection takes 124 us plain and 65 us
prepacked (Intel Xeon, AVX512 + AMX, 1 thread, weights in cache). Packing once, and again only
for the weights a version changes, is the "freezing" torch.compile does for CPU inference,
kept compatible with in-flight weight updates.

The packed weight is a copy: the engine's parameters stay the tensors the weight subscriber
writes into, and ``repack`` refreshes the copy of each one a version changed (``PackedWeight``:
where the layout allows, into a second copy, without oneDNN's reorder).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
from typing import Protocol

import numpy as np
import torch


class MemberOutputs(Protocol):
    """A merged packed copy that holds this layer's weight among others' (the fast decoder's
    q/k/v or gate/up, ``fast_decode.MergedProjection``)."""

    def member_output(self, index: int, x: torch.Tensor) -> torch.Tensor: ...


def can_prepack(model: torch.nn.Module) -> bool:
    """bf16 weights on a CPU whose oneDNN runs bf16 matmuls, with the packing ops in this build."""
    from streamrl.hardware import cpu_bf16_is_fast

    weight = next(model.parameters())
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and cpu_bf16_is_fast()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class PackedWeight:
    """One weight matrix in oneDNN's packed layout (``members`` stacked by rows: one layer's
    weight, or a merged projection's), and each new version of it written without a reorder.

    ``torch.ops.mkldnn._reorder_linear_weight`` allocates and reorders a new copy each time:
    for SmolLM2's linears, with the concatenations of the merged projections, 0.13-0.18 s of
    the generator's weight thread per version (Intel Xeon, AMX, one thread), the largest part
    of its work. Where the packed layout is a plain blocking of the rows (``_row_block``:
    ``[N / b, K / 2, b]`` of bf16 pairs, b = 32 with AMX, 64 with AVX512-bf16), a version is
    instead written into a second packed copy as a batched transpose, 0.06 s for the same
    weights, while the forward reads the first; ``adopt`` swaps them. The second copy is now
    held between versions too, but the peak is what it was (a reorder made the new copy
    while the forward read the old): SmolLM2's engine after three versions, RSS 1341 against
    1290 MB, peak 1394 against 1398 MB. A layout that is not a plain blocking (padded rows
    or columns, another ISA's) keeps the reorder, and the result is the same bytes."""

    def __init__(self, members: list[torch.Tensor], rows: int) -> None:
        self.rows = rows
        self.current = self._reorder(members)
        self._block = _row_block(members, rows)
        self.spare: torch.Tensor | None = None  # the copy no forward reads (after an adopt)

    def _reorder(self, members: list[torch.Tensor]) -> torch.Tensor:
        weight = members[0] if len(members) == 1 else torch.cat(members)
        return torch.ops.mkldnn._reorder_linear_weight(weight, self.rows)

    def pack(self, members: list[torch.Tensor]) -> torch.Tensor:
        """The packed copy of ``members``, to ``adopt``: written into the spare copy where
        the layout allows (the copy the forward reads is left alone), else a new one."""
        if self._block is None or self.spare is None:
            return self._reorder(members)
        blocks, start = _blocks(self.spare, self._block, members[0].shape[1]), 0
        for member in members:
            stop = start + member.shape[0]
            blocks[start // self._block : stop // self._block].copy_(
                _as_blocks(member, self._block)
            )
            start = stop
        return self.spare

    def adopt(self, packed: torch.Tensor) -> None:
        """Read ``packed`` from now on; the copy it replaces becomes the spare."""
        if packed is not self.current:
            self.spare = self.current if self._block is not None else None
            self.current = packed


def _blocks(packed: torch.Tensor, block: int, cols: int) -> torch.Tensor:
    """A packed weight's memory as ``[rows / block, cols / 2, block]`` int32 (bf16 pairs)."""
    size = torch.ops.mkldnn._nbytes(packed) // 4
    memory = (ctypes.c_int32 * size).from_address(torch.ops.mkldnn.data_ptr(packed))
    return torch.from_numpy(np.ctypeslib.as_array(memory)).view(-1, cols // 2, block)


def _as_blocks(weight: torch.Tensor, block: int) -> torch.Tensor:
    """A plain ``[rows, cols]`` bf16 weight as the ``_blocks`` layout (a strided view)."""
    rows, cols = weight.shape
    return weight.view(torch.int32).view(rows // block, block, cols // 2).permute(0, 2, 1)


def _row_block(members: list[torch.Tensor], rows: int) -> int | None:
    """The row block of the packed layout of ``members`` stacked, where it is a plain
    blocking and every member starts at a block boundary; None otherwise."""
    if not hasattr(torch.ops.mkldnn, "data_ptr") or not hasattr(torch.ops.mkldnn, "_nbytes"):
        return None
    sizes = [m.shape[0] for m in members]
    block = _layout_block(sum(sizes), members[0].shape[1], rows)
    starts = itertools.accumulate(sizes, initial=0)
    if block is None or any(start % block for start in starts):
        return None
    return block


@functools.cache
def _layout_block(rows: int, cols: int, rows_hint: int) -> int | None:
    """Which ``[rows / b, cols / 2, b]`` blocking oneDNN's packed layout of a ``[rows, cols]``
    bf16 weight is, found by packing two probes whose bits name each element's position (its
    index modulo and divided by ``_PERIOD``); None if it is none of them (then the layout is
    padded, or another shape). Once per shape: a few reorders."""
    if cols % 2:
        return None
    index = torch.arange(rows * cols, dtype=torch.int32)
    # Normal, finite bf16 bit patterns (1.0 upwards), so the reorder copies them as they are.
    probes = [((index % _PERIOD) + 0x3F80), ((index // _PERIOD) % _PERIOD + 0x3F80)]
    blocks = [16, 32, 64]
    for bits in probes:
        weight = bits.to(torch.int16).view(torch.bfloat16).view(rows, cols)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)
        if torch.ops.mkldnn._nbytes(packed) != weight.numel() * 2:
            return None
        blocks = [
            b
            for b in blocks
            if rows % b == 0 and torch.equal(_blocks(packed, b, cols), _as_blocks(weight, b))
        ]
    return blocks[0] if blocks else None


_PERIOD = 0x3C00  # 0x3F80 + _PERIOD - 1 is still a finite bf16


class PackedLinear(torch.nn.Module):
    """``source``'s forward with its weight prepacked for ``rows``-row inputs (a hint: any
    number of rows is computed correctly)."""

    def __init__(self, source: torch.nn.Linear, rows: int) -> None:
        super().__init__()
        self.source = source  # keeps the live parameter (and its name in the model) reachable
        self.rows = rows
        # Set by ``share``: the merged copy this layer's forward reads, as member ``index``.
        self.shared_by: tuple[MemberOutputs, int] | None = None
        self.weights: PackedWeight | None = PackedWeight([source.weight.detach()], rows)
        self.packed: torch.Tensor | None = self.weights.current  # what the forward reads

    def pack(self, new: dict[int, torch.Tensor]) -> torch.Tensor | None:
        """The packed copy of this layer's weight, or of ``new[id(weight)]`` if given (a
        version not adopted yet: packed on the weight thread while this layer decodes); None
        once ``share``d: the merged copy holds it."""
        if self.weights is None:
            return None
        weight = new.get(id(self.source.weight), self.source.weight.detach())
        return self.weights.pack([weight])

    def repack(self) -> None:
        self.adopt(self.pack({}))

    def adopt(self, packed: torch.Tensor | None) -> None:
        if self.weights is not None and packed is not None:
            self.weights.adopt(packed)
        self.packed = packed

    def share(self, owner: MemberOutputs, index: int) -> None:
        """Read this layer's output from ``owner``'s merged copy from now on, and drop this
        layer's own packed copy."""
        self.shared_by, self.packed, self.weights = (owner, index), None, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shared_by is not None:
            owner, index = self.shared_by
            return owner.member_output(index, x)
        flat = x.reshape(-1, x.shape[-1])
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.source.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], y.shape[-1])


def prepack_linears(model: torch.nn.Module, rows: int) -> dict[str, list[PackedLinear]]:
    """Replace every ``nn.Linear`` of ``model`` by a ``PackedLinear``; returns, per parameter
    name (as ``named_parameters`` gives it, tied weights once), the layers to repack when that
    parameter changes."""
    names = {id(p): name for name, p in model.named_parameters()}
    by_param: dict[str, list[PackedLinear]] = {}
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                packed = PackedLinear(child, rows)
                setattr(parent, child_name, packed)
                by_param.setdefault(names[id(child.weight)], []).append(packed)
    return by_param
