"""The learner's LoRA forward: each adapted layer computes with the merged bf16 weight its
generators hold (``streamrl.models.lora.LoraMerge``), and A and B get unmerged LoRA's gradients."""

from __future__ import annotations

import torch

from streamrl.models.lora import merged_weight


class _MergedLinear(torch.autograd.Function):
    """``y = x round(W0 + s B A)^T + bias``: the forward with the merged bf16 weight, the
    backward as unmerged LoRA's. The gradients of A and B through the rounding are taken as
    if it were not there (straight-through, as ``workers.learning.fsdp`` rounds full weights), which
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
