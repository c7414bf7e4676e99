"""Rows that hold a prompt once: the layout the learner's forward and a teacher's share.

A group's samples share their prompt, which one row holds once, followed by every sample's
response: ``[prompt | response 1 | response 2 | ...]``. A 4-D attention mask lets each
response see the prompt and its own earlier tokens only, and position ids restart after the
prompt for each response, so every response token is computed from exactly the context it
was sampled in (``workers.learning.batching`` documents the learner's use; the teacher,
``workers.reward_roles.teacher``, scores a group's eight responses over one copy of the
prompt). The learner also packs several prompts that begin alike (a chat template's system
prompt) into one row as a prefix tree, ``[shared | rest A | A's responses | rest B | ...]``
(``tree_attention``). Eager and SDPA attention take such a mask; flash kernels and
sliding-window layers do not (``can_share_prompts``).
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


# A column's branch in a packed row (``tree_attention``): the prompt tokens the row's prompts
# share, or padding; a column of one prompt's own tokens or responses has that prompt's index.
SHARED, PADDING = -1, -2


def tree_attention(branch: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """The attention ([S, W, W] bool) of rows that hold a prefix tree: the prompt tokens
    several prompts share (branch ``SHARED``), then each prompt's own rest (branch f, segment
    0) and its responses (branch f, segment k >= 1, numbered within the row). A query sees
    the keys at or before it that are shared, or of its branch and either its prompt or its
    own segment; padding (``PADDING``) sees only itself (a row with nothing to attend to
    would be NaN). ``branch``, ``segment``: [S, W] int64."""
    width = branch.shape[1]
    q_branch, k_branch = branch[:, :, None], branch[:, None, :]
    q_segment, k_segment = segment[:, :, None], segment[:, None, :]
    own = (k_branch == q_branch) & ((k_segment == 0) | (k_segment == q_segment))
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    attention = causal & ((k_branch == SHARED) | own) & (q_branch != PADDING)
    return attention | torch.eye(width, dtype=torch.bool)


def shared_prompt_attention(
    prompts: list[int], segments: list[tuple[int, int, int]], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared-prompt layout's attention ([S, W, W] bool) and position ids ([S, W]): one
    prompt per row (``prompts``: its length), a tree whose shared part is the whole prompt.

    Column c of a sequence belongs to segment 0 (the prompt), k >= 1 (the k-th response) or
    -1 (padding). A query sees the keys at or before it in the prompt or in its own segment;
    padding sees only itself. A response's positions continue its prompt's, as when it was
    sampled."""
    count = len(prompts)
    branch = torch.full((count, width), PADDING, dtype=torch.long)
    segment = torch.zeros((count, width), dtype=torch.long)
    positions = torch.zeros((count, width), dtype=torch.long)
    for s, p in enumerate(prompts):
        branch[s, :p] = SHARED
        positions[s, :p] = torch.arange(p)
    numbers = [0] * count
    for s, column, n in segments:
        numbers[s] += 1
        branch[s, column : column + n] = 0
        segment[s, column : column + n] = numbers[s]
        positions[s, column : column + n] = torch.arange(prompts[s], prompts[s] + n)
    return tree_attention(branch, segment), positions


def additive_mask(attention: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``attention`` ([S, W, W] bool) as the additive [S, 1, W, W] mask a forward takes, in
    its compute ``dtype``; the blocked value is bfloat16's lowest, finite in float32 and
    bfloat16 alike (``MicroBatch.model_inputs`` says why the dtype matters)."""
    blocked = torch.finfo(torch.bfloat16).min
    mask = torch.zeros(attention.shape, dtype=dtype, device=attention.device)
    return mask.masked_fill_(~attention, blocked)[:, None]
