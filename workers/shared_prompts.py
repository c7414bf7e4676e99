"""One row per prompt: the layout the learner's forward and a teacher's share.

A group's samples share their prompt, which one row holds once, followed by every sample's
response: ``[prompt | response 1 | response 2 | ...]``. A 4-D attention mask lets each
response see the prompt and its own earlier tokens only, and position ids restart after the
prompt for each response, so every response token is computed from exactly the context it
was sampled in (``workers.learning.batching`` documents the learner's use; the teacher,
``workers.reward_roles.teacher``, scores a group's eight responses over one copy of the
prompt). Eager and SDPA attention take such a mask; flash kernels and sliding-window layers
do not (``can_share_prompts``).
"""

from __future__ import annotations

import torch


def can_share_prompts(model_config) -> bool:
    """Whether a model with this config can run the shared-prompt layout: eager or SDPA
    attention and no sliding-window layer (one 4-D mask serves every layer, so a windowed
    layer would see past its window and score what no engine sampled)."""
    attention = getattr(model_config, "_attn_implementation", None)
    return attention in ("eager", "sdpa") and not has_sliding_window(model_config)


def has_sliding_window(model_config) -> bool:
    """Whether some attention layer of the model attends within a window (Gemma 2/3,
    Mistral v0.1, Qwen2 with use_sliding_window)."""
    types = getattr(model_config, "layer_types", None)
    if types:
        return "sliding_attention" in types
    if getattr(model_config, "use_sliding_window", True) is False:
        return False
    return getattr(model_config, "sliding_window", None) is not None


def shared_prompt_attention(
    prompts: list[int], segments: list[tuple[int, int, int]], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared-prompt layout's attention ([S, W, W] bool) and position ids ([S, W]).

    Column c of a sequence belongs to segment 0 (the prompt), k >= 1 (the k-th response) or
    -1 (padding). A query sees the keys at or before it in the prompt or in its own segment;
    padding sees only itself (a row with nothing to attend to would be NaN). A response's
    positions continue its prompt's, as when it was sampled."""
    count = len(prompts)
    segment = torch.full((count, width), -1, dtype=torch.long)
    positions = torch.zeros((count, width), dtype=torch.long)
    for s, p in enumerate(prompts):
        segment[s, :p] = 0
        positions[s, :p] = torch.arange(p)
    numbers = [0] * count
    for s, column, n in segments:
        numbers[s] += 1
        segment[s, column : column + n] = numbers[s]
        positions[s, column : column + n] = torch.arange(prompts[s], prompts[s] + n)
    query, key = segment[:, :, None], segment[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    attention = causal & ((key == 0) | (key == query)) & (query >= 0)
    return attention | torch.eye(width, dtype=torch.bool), positions


def additive_mask(attention: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``attention`` ([S, W, W] bool) as the additive [S, 1, W, W] mask a forward takes, in
    its compute ``dtype``; the blocked value is bfloat16's lowest, finite in float32 and
    bfloat16 alike (``MicroBatch.model_inputs`` says why the dtype matters)."""
    blocked = torch.finfo(torch.bfloat16).min
    mask = torch.zeros(attention.shape, dtype=dtype, device=attention.device)
    return mask.masked_fill_(~attention, blocked)[:, None]
