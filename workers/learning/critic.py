"""The GAE critic: a value model trained beside the policy on the same learner ranks.

Architecture: the policy's backbone (loaded from the same weights, without the LM head) and a
zero-initialised scalar head, so initial values are 0 and early advantages are the plain
returns. It is FSDP2-sharded like the policy and has its own AdamW.

Alignment: ``values(inputs)[:, c]`` is the value of the state at column c, from which the
token after it is sampled, so ``MicroBatch.gather`` lines it up with the policy's logprobs and
the response mask as it does the logits.

The "old" values used for value clipping and for GAE are the values before the step's first
update (one no-grad pass over the batch), however many PPO updates follow. Like the policy it
runs on the micro-batch's layout, shared-prompt or not (``batching``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh

from streamrl.config import Config
from streamrl.workers.learning.fsdp import adamw, clip_and_step, shard_for_training


class ValueModel(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(**inputs).last_hidden_state
        # sum over the size-1 axis, not squeeze: FSDP2 warns about returning a view
        return self.head(hidden).float().sum(-1)


class Critic:
    def __init__(
        self,
        config: Config,
        model_dir: Path,
        mesh: DeviceMesh,
        device: torch.device,
        compute_dtype: str,
    ) -> None:
        from transformers import AutoModel

        dtype = getattr(torch, config.model.learner_dtype)
        backbone = AutoModel.from_pretrained(model_dir, dtype=dtype)
        self.model = ValueModel(backbone, backbone.config.hidden_size).to(
            device=device, dtype=dtype
        )
        if config.learner.activation_checkpointing:
            backbone.gradient_checkpointing_enable({"use_reentrant": False})
        # Its weights never reach a generator: no need to compute on the bf16 image.
        shard_for_training(self.model, mesh, compute_dtype, round_to_bf16=False)
        alg, lc = config.algorithm, config.learner
        # From config, not the optimizer: a resumed optimizer holds a scaled learning rate.
        self.base_lr = alg.critic_lr or lc.lr
        self.optimizer = adamw(
            self.model.parameters(), self.base_lr, lc.betas, lc.weight_decay, device
        )
        self.grad_clip = lc.grad_clip

    def values(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """A micro-batch's ``model_inputs(dtype)`` -> [S, W] values; column c is the value of the
        state that predicts the token after it, as the policy's logits there."""
        return self.model(**inputs)

    def set_lr_scale(self, scale: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * scale

    def step(self) -> tuple[torch.Tensor, bool]:
        """Clip and step (skipped on a non-finite norm); returns (norm, stepped)."""
        return clip_and_step(self.model, self.optimizer, self.grad_clip)
