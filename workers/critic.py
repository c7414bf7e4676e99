"""The GAE critic: a value model trained beside the policy on the same learner ranks.

Architecture: the policy's backbone (loaded from the same weights, without the LM head) and a
zero-initialised scalar head, so initial values are 0 and early advantages are the plain
returns. It is FSDP2-sharded like the policy and has its own AdamW.

Alignment: ``values(ids)[:, j]`` is V(prefix ``ids[:, :j+1]``), the state from which token
``j+1`` is sampled, so it lines up with the policy's ``logprobs[:, j]`` and the response mask.

Scope: one optimizer step per batch, so the "old" values used for value clipping and for GAE
are this step's own values before the update (one no-grad pass over the batch). Advantages are
whitened per rank over the rank's tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh

from streamrl.config import Config
from streamrl.workers.fsdp import apply_fsdp, clip_and_step


class ValueModel(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden).squeeze(-1).float()


class Critic:
    def __init__(self, config: Config, model_dir: Path, mesh: DeviceMesh, device: torch.device):
        from transformers import AutoModel

        dtype = getattr(torch, config.model.learner_dtype)
        backbone = AutoModel.from_pretrained(model_dir, dtype=dtype)
        self.model = ValueModel(backbone, backbone.config.hidden_size).to(
            device=device, dtype=dtype
        )
        apply_fsdp(self.model, mesh, config.learner.mp_param_dtype)
        alg, lc = config.algorithm, config.learner
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=alg.critic_lr or lc.lr,
            betas=lc.betas,
            weight_decay=lc.weight_decay,
        )
        self.grad_clip = lc.grad_clip

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, T] ids -> [B, T-1] values aligned with the next-token targets."""
        return self.model(input_ids, attention_mask)[:, :-1]

    def step(self) -> torch.Tensor:
        return clip_and_step(self.model, self.optimizer, self.grad_clip)
