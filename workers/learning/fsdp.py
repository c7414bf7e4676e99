"""FSDP2 in one function (``shard_for_training``). Nothing else imports
``torch.distributed.fsdp``.

On a mesh of one rank there is nothing to shard, and FSDP2 only copies: each step it copies
every parameter into its unsharded buffer, and every gradient twice on the way back (its
reduce-scatter input and output), ~5 passes over the model. There a ``ComputeImage`` does what
FSDP2's unshard/reshard would: it keeps one compute-dtype copy of the parameters, refreshed
from the fp32 masters when a forward first needs them, and swaps it in until the gradients
are taken. The default job's step alone, 1 thread, AMD EPYC: fp32 (AVX2) 2.2-2.4 s -> 1.9-2.1
s, a plain PyTorch loop 1.9-2.0 s; bf16 (AVX512) 1.26-1.99 s -> 1.13-1.30 s.

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


def shard_for_training(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    compute_dtype: str,
    *,
    round_to_bf16: bool = True,
) -> torch.nn.Module:
    """Shard every decoder block, then the root (embeddings, final norm, LM head); on a mesh
    of one rank, attach a ``ComputeImage`` instead (module doc).

    Parameters are all-gathered in ``compute_dtype``; gradients are reduced in float32. With
    fp32 compute and ``round_to_bf16`` the forward uses the bf16-rounded values (module doc);
    a frozen model loaded from a bf16 checkpoint needs no rounding.
    """
    dtype = getattr(torch, compute_dtype)
    rounding = round_to_bf16 and dtype != torch.bfloat16
    if mesh.size() == 1:
        masters = {p.dtype for p in model.parameters()}
        if rounding or masters != {dtype}:
            ComputeImage(model, dtype, rounding)
        return model
    return fully_shard_model(model, mesh, dtype, rounding)


def fully_shard_model(
    model: torch.nn.Module, mesh: DeviceMesh, dtype: torch.dtype, rounding: bool
) -> torch.nn.Module:
    """FSDP2 proper, on any mesh (``shard_for_training`` uses it on two ranks or more)."""
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


class ComputeImage:
    """One rank's parameters as the forward sees them: FSDP2's unshard and reshard, without
    the copies that only sharding needs.

    The model's parameters stay the fp32 masters, which the optimizer, checkpoints, exports
    and the weight publisher read. The first forward after a release refreshes one buffer per
    parameter from its master (cast to bf16, or rounded to the bf16 grid in fp32) and points
    the parameter at it; the end of the backward (unless ``keep_after_backward``: between the
    micro-batches of one update, as ``set_gradient_sync`` says), or ``release`` after a
    forward that no backward follows, points it back at the master. Gradients land on the
    masters unchanged (a straight-through estimator, as with FSDP2 above); bf16 gradients are
    added into a float32 one as each backward produces them, as FSDP2 accumulates them.

    Example: a master 1.00001 enters the forward as 1.0 (the generators' bf16 value); its
    gradient at 1.0 moves the master to 0.99991; the next forward sees round(0.99991).

    The weight publisher casts the same masters to bf16 right after each optimizer step;
    ``offer`` hands those copies over, and the next refresh takes them instead of casting
    every master again (SmolLM2-135M: ~0.1 s a step on one core). An offer holds until the
    next refresh or release: the masters change only after a release.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, rounding: bool) -> None:
        # Tied weights once. A frozen parameter already in the compute dtype (a LoRA run's
        # base, loaded so) is used as it is: copying it each forward would buy nothing.
        self.params = [p for p in model.parameters() if p.requires_grad or p.dtype != dtype]
        self.masters = [p.data for p in self.params]
        self.images = [torch.empty_like(p, dtype=dtype) for p in self.params]
        self.rounding, self.active, self.keep_after_backward = rounding, False, False
        # float32 gradients summed over the micro-batches of one update (bf16 images only)
        self.grads: list[torch.Tensor | None] = [None] * len(self.params)
        self._release_queued = False
        self._index = {name: i for i, name in enumerate(_names(model, self.params))}
        self._offered: dict[int, torch.Tensor] = {}  # param index -> its image, ready
        model.register_forward_pre_hook(lambda _module, _args: self.enter())
        for i, param in enumerate(self.params):
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._after_grad_hook(i))
        model.compute_image = self

    def offer(self, images: dict[str, torch.Tensor]) -> int:
        """Copies of the masters as they are now, by parameter name (the publisher's bf16
        snapshot, never written after), for the next refresh to take; those that are not
        exactly what the refresh would make (another dtype, device or shape, a rounding
        image in fp32) are left out. Returns how many were taken."""
        self._offered = {}
        if self.rounding:
            return 0
        for name, tensor in images.items():
            i = self._index.get(name)
            image = None if i is None else self.images[i]
            if image is not None and (tensor.dtype, tensor.device, tensor.shape) == (
                image.dtype,
                image.device,  # a GPU learner's snapshot is on the host
                image.shape,
            ):
                self._offered[i] = tensor
        return len(self._offered)

    @torch.no_grad()
    def enter(self) -> None:
        if self.active:
            return
        offered, self._offered = self._offered, {}
        for i, (param, master, image) in enumerate(
            zip(self.params, self.masters, self.images, strict=True)
        ):
            if i in offered:
                image = offered[i]  # the same cast of the same master, made by the publisher
            else:
                image.copy_(master.to(torch.bfloat16) if self.rounding else master)
            if image.dtype != master.dtype:
                self.grads[i], param.grad = param.grad, None
            param.data = image
        self.active = True

    @torch.no_grad()
    def release(self) -> None:
        self._offered = {}  # the masters may change now
        if not self.active:
            return
        for i, (param, master) in enumerate(zip(self.params, self.masters, strict=True)):
            param.data = master
            if self.images[i].dtype != master.dtype:
                param.grad, self.grads[i] = self.grads[i], None
        self.active = False

    def _after_grad_hook(self, i: int):
        def hook(param: torch.Tensor) -> None:
            if self.images[i].dtype != self.masters[i].dtype:
                with torch.no_grad():
                    if self.grads[i] is None:
                        self.grads[i] = param.grad.float()
                    else:
                        self.grads[i].add_(param.grad)
                param.grad = None
            if not self._release_queued:
                # Runs once this backward has finished, as FSDP2's post-backward callback.
                self._release_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

        return hook

    def _after_backward(self) -> None:
        self._release_queued = False
        if not self.keep_after_backward:
            self.release()


def _names(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> list[str]:
    """Each of ``params``' name in ``model`` (the first, for a tied one)."""
    by_id: dict[int, str] = {}
    for name, param in model.named_parameters():
        by_id.setdefault(id(param), name)
    return [by_id[id(p)] for p in params]


def offer_compute_image(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> int:
    """Hand a one-rank model's compute image ready copies of its masters (``ComputeImage.offer``);
    0 where there is none (FSDP2 on several ranks gathers its own)."""
    image = getattr(model, "compute_image", None)
    return image.offer(images) if image is not None else 0


def release_compute_image(model: torch.nn.Module) -> None:
    """Point a one-rank model's parameters back at their masters (no-op otherwise)."""
    image = getattr(model, "compute_image", None)
    if image is not None:
        image.release()


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
        image = getattr(module, "compute_image", None)
        if image is not None:
            image.keep_after_backward = not sync
        if not isinstance(module, FSDPModule):
            continue  # one rank: nothing to reduce, gradients accumulate in place
        keep = _keeps_gathered(next(module.parameters()).device.type)
        module.set_requires_gradient_sync(sync)
        module.set_reshard_after_backward(sync or not keep)


def reshard(model: torch.nn.Module) -> None:
    """Free the gathered parameters after a forward that no backward follows (with
    ``reshard_after_forward=False`` they would otherwise stay, and go stale at the next
    optimizer step)."""
    release_compute_image(model)
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
    release_compute_image(module)
    trainable = [p for p in module.parameters() if p.requires_grad]  # LoRA: the adapters
    norm = torch.nn.utils.clip_grad_norm_(trainable, max_norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    stepped = bool(torch.isfinite(norm))
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, stepped
