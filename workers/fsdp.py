"""FSDP2 in one function (STYLE.md #8). Nothing else imports ``torch.distributed.fsdp``."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks, found by the class names HF lists as not splittable."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        blocks = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    return blocks


def apply_fsdp(model: torch.nn.Module, mesh: DeviceMesh, mp_param_dtype: str) -> torch.nn.Module:
    """Shard every decoder block, then the root (embeddings, final norm, LM head).
    Parameters are all-gathered in ``mp_param_dtype``; gradients are reduced in float32."""
    policy = MixedPrecisionPolicy(
        param_dtype=getattr(torch, mp_param_dtype), reduce_dtype=torch.float32
    )
    for block in decoder_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def clip_and_step(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float
) -> torch.Tensor:
    """Clip the (sharded) gradients to ``max_norm``, step, zero; return the pre-clip norm as a
    plain tensor (under FSDP2 the norm is a DTensor reduced over ranks)."""
    norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
