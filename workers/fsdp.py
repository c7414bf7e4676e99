"""FSDP2 in one function. Nothing else imports ``torch.distributed.fsdp``.

The forward always sees the bf16 image the generators hold (docs/design.md §5b):

- compute in bf16: FSDP2 all-gathers the parameters in bf16 (``param_dtype``), which *is*
  the rounding the weight publisher applies;
- compute in fp32 (CPUs without fast bf16): parameters are all-gathered in fp32 and rounded
  in place to the bf16 grid by a forward pre-hook. The fp32 masters (the sharded parameters)
  are untouched and the gradient reaches them unchanged: a straight-through estimator. The
  unsharded parameters are kept until backward (``reshard_after_forward=False``), so that
  backward sees the rounded values too.

Example: a master weight 1.00001 (off the bf16 grid) enters the forward as 1.0, and an
optimizer step moves the master, not the rounded copy.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks, found by the class names HF lists as not splittable."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        blocks = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    return blocks


def apply_fsdp(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    compute_dtype: str,
    *,
    round_to_bf16: bool = True,
) -> torch.nn.Module:
    """Shard every decoder block, then the root (embeddings, final norm, LM head).

    Parameters are all-gathered in ``compute_dtype``; gradients are reduced in float32. With
    fp32 compute and ``round_to_bf16`` the forward uses the bf16-rounded values (module doc);
    a frozen model loaded from a bf16 checkpoint needs no rounding.
    """
    dtype = getattr(torch, compute_dtype)
    rounding = round_to_bf16 and dtype != torch.bfloat16
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    # Gathered parameters stay from forward to backward when rounding (module doc), and
    # where _keeps_gathered says.
    keep = rounding or _keeps_gathered(mesh.device_type)
    blocks = decoder_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=not keep)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=not keep)
    if rounding:
        # Registered after fully_shard, so each hook runs after FSDP2's all-gather.
        inside_blocks = {id(m) for block in blocks for m in block.modules()}
        for block in blocks:
            block.register_forward_pre_hook(_rounding_hook(list(block.modules())))
        root_owned = [m for m in model.modules() if id(m) not in inside_blocks]
        model.register_forward_pre_hook(_rounding_hook(root_owned))
    return model


def _rounding_hook(modules: list[torch.nn.Module]):
    def hook(_module: torch.nn.Module, _args) -> None:
        with torch.no_grad():
            for module in modules:
                # Read the parameters now: FSDP2 registers the unsharded ones during forward.
                for param in module._parameters.values():
                    if param is not None and param.dtype != torch.bfloat16:
                        param.data.copy_(param.data.to(torch.bfloat16))

    return hook


def adamw(
    params, lr: float, betas: tuple[float, float], weight_decay: float, device: torch.device
) -> torch.optim.AdamW:
    """AdamW over (sharded) parameters with the fused kernel (CUDA and CPU). Left to its
    default, AdamW may take the per-tensor path, where every op on a DTensor pays a Python
    dispatch: hundreds of milliseconds per step for a 135M model on a GPU. On a CPU the fused
    kernel also beats the multi-tensor one: 0.15 s against 0.55 s per step for 135M fp32
    parameters on one core (Intel Xeon, AVX512; ``benchmarks/learner.py --adamw``)."""
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(
        params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused, foreach=not fused
    )


def _keeps_gathered(device_type: str) -> bool:
    """Whether gathered parameters are kept rather than resharded between uses: on a CPU,
    where memory is plentiful and a re-gather is a copy of the whole model (135M params: ~0.1 s
    on one core, twice per micro-batch otherwise). On a GPU keeping them would hold a whole
    unsharded model between micro-batches."""
    return device_type == "cpu"


def set_gradient_sync(modules: list[torch.nn.Module], sync: bool) -> None:
    """Whether the next backward reduce-scatters gradients (off between the micro-batches of
    one update: they accumulate unsharded and are reduced once, with the last one). Where
    ``_keeps_gathered``, an unsynced backward also keeps the parameters gathered, so they are
    gathered once per update rather than per micro-batch: they cannot change before the
    optimizer step."""
    for module in modules:
        keep = _keeps_gathered(next(module.parameters()).device.type)
        module.set_requires_gradient_sync(sync)
        module.set_reshard_after_backward(sync or not keep)


def reshard(model: torch.nn.Module) -> None:
    """Free the gathered parameters after a forward that no backward follows (with
    ``reshard_after_forward=False`` they would otherwise stay, and go stale at the next
    optimizer step)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def clip_and_step(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float
) -> tuple[torch.Tensor, bool]:
    """Clip the (sharded) gradients to ``max_norm`` and step, unless their norm is not finite
    (NaN/inf): then the step is skipped. Zeroes the gradients either way. Returns the pre-clip
    norm as a plain tensor (under FSDP2 it is a DTensor reduced over ranks, so every rank
    decides alike) and whether the step was taken (one host sync per update)."""
    norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    stepped = bool(torch.isfinite(norm))
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, stepped
