"""Linear layers with oneDNN-prepacked bf16 weights, for CPU decoding.

A plain bf16 ``F.linear`` on CPU reorders its weight into oneDNN's blocked layout on every
call. A decode step is a handful of rows against every weight of the model, so that reorder is
a large part of it: SmolLM2's [16, 576] x [576, 1536] projection takes 124 us plain and 65 us
prepacked (Intel Xeon, AVX512 + AMX, 1 thread, weights in cache). Packing once, and again only
for the weights a version changes, is the "freezing" torch.compile does for CPU inference,
kept compatible with in-flight weight updates.

The packed weight is a copy: the engine's parameters stay the tensors the weight subscriber
writes into, and ``repack`` refreshes the copy of each one a version changed.
"""

from __future__ import annotations

from typing import Protocol

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


class PackedLinear(torch.nn.Module):
    """``source``'s forward with its weight prepacked for ``rows``-row inputs (a hint: any
    number of rows is computed correctly)."""

    def __init__(self, source: torch.nn.Linear, rows: int) -> None:
        super().__init__()
        self.source = source  # keeps the live parameter (and its name in the model) reachable
        self.rows = rows
        # Set by ``share``: the merged copy this layer's forward reads, as member ``index``.
        self.shared_by: tuple[MemberOutputs, int] | None = None
        self.packed: torch.Tensor | None = self._pack()

    def _pack(self) -> torch.Tensor:
        return self.pack({})

    def pack(self, new: dict[int, torch.Tensor]) -> torch.Tensor | None:
        """The packed copy of this layer's weight, or of ``new[id(weight)]`` if given (a
        version not adopted yet: packed on the weight thread while this layer decodes); None
        once ``share``d: the merged copy holds it."""
        if self.shared_by is not None:
            return None
        weight = new.get(id(self.source.weight), self.source.weight.detach())
        return torch.ops.mkldnn._reorder_linear_weight(weight, self.rows)

    def repack(self) -> None:
        self.packed = self._pack()

    def adopt(self, packed: torch.Tensor | None) -> None:
        self.packed = packed

    def share(self, owner: MemberOutputs, index: int) -> None:
        """Read this layer's output from ``owner``'s merged copy from now on, and drop this
        layer's own packed copy."""
        self.shared_by, self.packed = (owner, index), None

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
