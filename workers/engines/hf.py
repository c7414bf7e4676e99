"""Hugging Face transformers engine: batched prefill + decode with a KV cache (CPU or GPU).

Sampling: logits / temperature, then top-k, then top-p (nucleus) truncation, then one draw.
The logprob recorded for a token is ``log p(token)`` under that final truncated, renormalised
distribution: the distribution actually sampled from, which is what importance correction
needs as the behaviour policy. (With top-p/top-k < full the learner's untruncated
distribution differs from it on the tail; the IS weight absorbs that.)

In-flight updates: ``on_step`` runs between decode steps; when it swaps weights the running
sequences continue with the cached keys/values of the old weights and new tokens are tagged
with the new version (PipelineRL-style; the KV cache is not recomputed).

Batching is static: a call runs until every sequence stops; finished slots are not refilled
with new prompts (no continuous batching in this engine).
"""

from __future__ import annotations

from pathlib import Path

import torch

from streamrl.models import load_causal_lm
from streamrl.workers.engines.base import Engine, GenerationOutput, SamplingParams, StepHook


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] -> (tokens [B], logprobs [B]) under the truncated distribution."""
    scores = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (keeps at least one).
        drop_sorted = (cumulative - torch.softmax(sorted_scores, dim=-1)) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    logprobs = torch.log_softmax(scores, dim=-1)
    tokens = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


class HFEngine(Engine):
    def __init__(
        self, model_dir: Path, *, device: str = "cpu", dtype: str = "bfloat16", seed: int = 0
    ) -> None:
        self.device = torch.device(device)
        self.model = load_causal_lm(model_dir, dtype=dtype, device=device).eval()
        self.model.requires_grad_(False)
        self.params = dict(self.model.named_parameters())
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.version = 0

    def shared_weights(self) -> dict[str, torch.Tensor]:
        """The live parameter tensors: a subscriber writing into them updates the engine."""
        return {name: p.data for name, p in self.params.items()}

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        with torch.no_grad():
            for name, tensor in named_tensors:
                param = self.params[name]
                if param.data_ptr() != tensor.data_ptr():  # shared image: already in place
                    param.data.copy_(tensor.to(param.device, param.dtype))
        self.version = version

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, on_step: StepHook | None = None
    ) -> list[GenerationOutput]:
        from transformers import DynamicCache

        batch = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for i, prompt in enumerate(prompts):  # left padding keeps the next position aligned
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            attention[i, width - len(prompt) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        stop = torch.tensor(params.stop_token_ids or [-1], device=self.device)
        outputs = [GenerationOutput([], [], [], "length") for _ in range(batch)]
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)

        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        for step in range(params.max_new_tokens):
            tokens, logprobs = sample_tokens(logits, params, self.generator)
            hit_stop = torch.isin(tokens, stop)
            for i, (tok, lp, stopped) in enumerate(
                zip(tokens.tolist(), logprobs.tolist(), hit_stop.tolist(), strict=True)
            ):
                if done[i]:
                    continue
                out = outputs[i]
                out.response_ids.append(tok)
                out.logprobs.append(lp)
                out.token_versions.append(self.version)
                if stopped:
                    out.finish_reason = "stop"
            done |= hit_stop
            if bool(done.all()) or step == params.max_new_tokens - 1:
                break
            if on_step is not None:
                on_step(self)
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)
            positions = positions[:, -1:] + 1
            logits = self.model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
        return outputs
