"""A generator's LoRA: the adapters the weight stream carries, merged into its engine's weights.

Every engine takes LoRA the same way: as full weights through ``Engine.update_weights``, the
path full fine-tuning uses, merged here as ``W = W0 + (alpha / r) * B @ A`` in float32 and
rounded once to bf16 (the image dtype). So an update lands between two decode steps like any
other (version tags, no aborts), and no engine needs LoRA kernels. vLLM's own LoRA
(``LoRARequest``) is not used: it loads an adapter per request from disk and keeps it for the
request's life, so an update could not reach a sequence in flight, and every version would be
a new adapter to load and evict (docs/design.md §7).

The subscriber's image holds the adapters (wire names, ``streamrl.lora``); this class keeps
the base weights of the adapted layers (bf16, as loaded) and turns changed adapter tensors into
the merged weights of their layers.

Example: the subscriber reports ``...q_proj.lora_B.weight`` changed at version 5; ``merged``
returns ``[("model.layers.0.self_attn.q_proj.weight", W0 + s * B @ A)]``, and the engine's
``update_weights(..., version=5)`` takes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from streamrl.lora import AdapterSettings
from streamrl.models import load_bf16_image

_PREFIX = "base_model.model."  # peft's wrapper path before the base model's own names


def layer_of(wire: str) -> str:
    """``base_model.model.X.lora_A.weight`` -> ``X`` (the adapted layer's module path)."""
    body = wire.removeprefix(_PREFIX)
    for part in (".lora_A.", ".lora_B."):
        if part in body:
            return body.split(part)[0]
    raise ValueError(f"{wire}: not a LoRA A/B tensor name")


class LoraMerge:
    """Merged weights of the adapted layers from the adapter image (see module doc)."""

    def __init__(
        self, model_dir: Path, adapters: dict[str, torch.Tensor], settings: AdapterSettings
    ) -> None:
        self.scale = settings.scale
        self.layers = sorted({layer_of(name) for name in adapters})
        base = load_bf16_image(model_dir)
        missing = [f"{layer}.weight" for layer in self.layers if f"{layer}.weight" not in base]
        if missing:
            raise ValueError(f"adapted layer {missing[0]} is not in {model_dir}")
        # Only the adapted layers' base weights are kept; the rest of the image is dropped.
        self.base = {layer: base[f"{layer}.weight"] for layer in self.layers}

    def merged(
        self, adapters: dict[str, torch.Tensor], changed: Iterable[str] | None = None
    ) -> list[tuple[str, torch.Tensor]]:
        """(checkpoint name, merged bf16 weight) of every layer an adapter tensor in
        ``changed`` belongs to (None: every adapted layer), from the adapter image."""
        layers = self.layers if changed is None else sorted({layer_of(n) for n in changed})
        return [(f"{layer}.weight", self.merge(adapters, layer)) for layer in layers]

    @torch.no_grad()
    def merge(self, adapters: dict[str, torch.Tensor], layer: str) -> torch.Tensor:
        a = adapters[f"{_PREFIX}{layer}.lora_A.weight"]
        b = adapters[f"{_PREFIX}{layer}.lora_B.weight"]
        return merged_weight(self.base[layer], a, b, self.scale).to(torch.bfloat16)


def merged_weight(
    base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float
) -> torch.Tensor:
    """``W0 + scale * B @ A`` in float32: the one merge formula of the generators and of the
    learner's forward (``merge_in_forward``), before the rounding to bf16."""
    return base.float() + scale * (b.float() @ a.float())


class _MergedLinear(torch.autograd.Function):
    """``y = x round(W0 + s B A)^T + bias``: the forward with the merged bf16 weight, the
    backward as unmerged LoRA's. The gradients of A and B through the rounding are taken as
    if it were not there (straight-through, as ``workers.fsdp`` rounds full weights), which
    is ``dB = s gY^T (x A^T)`` and ``dA = s (gY B)^T x``: never the [out, in] weight
    gradient that full fine-tuning forms, so LoRA keeps its cheap backward."""

    @staticmethod
    def forward(ctx, x, base, bias, a, b, scale):
        weight = merged_weight(base, a, b, scale).to(torch.bfloat16).to(x.dtype)
        ctx.save_for_backward(x, weight, a, b)
        ctx.scale = scale
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight, a, b = ctx.saved_tensors
        scale = ctx.scale
        grad_x = grad @ weight
        flat_grad = grad.reshape(-1, grad.shape[-1])
        flat_x = x.reshape(-1, x.shape[-1])
        grad_b = scale * (flat_grad.t() @ (flat_x @ a.t().to(x.dtype)))
        grad_a = scale * ((flat_grad @ b.to(x.dtype)).t() @ flat_x)
        return grad_x, None, None, grad_a.to(a.dtype), grad_b.to(b.dtype), None


def merge_in_forward(model: torch.nn.Module) -> int:
    """Make every LoRA linear layer of a peft ``model`` compute with the merged bf16 weight
    ``round(W0 + scale * B @ A)``, the weight its generators sample with, instead of peft's
    unmerged ``W0 x + scale * B A x``. Unmerged, the learner would score the adapters' full
    update while an engine holds it rounded into W0's bf16 grid, where a change below half a
    step is lost: on SmolLM2-135M (r=16) the staleness-0 mismatch k3 rose from 0.0017 to
    0.0082 over the first 6 steps, and |Δ logprob| reached 1.28. Gradients reach A and B
    through the rounding unchanged. Returns the number of layers changed.

    Costs against unmerged LoRA: per layer and forward, one [out, in] merge (2 r out in
    FLOPs and a few passes over the weight); the backward is unmerged LoRA's
    (``_MergedLinear``)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    count = 0
    for module in model.modules():
        if isinstance(module, LoraLinear):
            module.forward = _merged_forward(module)
            count += 1
    return count


def _merged_forward(layer):
    (name,) = layer.active_adapters  # one adapter per run
    scale = layer.scaling[name]

    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        base = layer.base_layer
        a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
        return _MergedLinear.apply(x, base.weight, base.bias, a, b, scale)

    return forward


def is_base(adapters: dict[str, torch.Tensor]) -> bool:
    """True while every B is zero (a fresh adapter: the engine already holds the base)."""
    return all(not bool(t.any()) for name, t in adapters.items() if ".lora_B." in name)
