"""Hugging Face transformers engine: batched prefill + decode with a KV cache (CPU or GPU).

Sampling: logits / temperature, then top-k, then top-p (nucleus) truncation, then one draw
(temperature 0 is greedy: argmax, logprob 0). The logprob recorded for a token is
``log p(token)`` under that final truncated, renormalised distribution: the distribution
actually sampled from, which is what importance correction needs as the behaviour policy.
(With top-p/top-k < full the learner's untruncated distribution differs from it on the tail;
the IS weight absorbs that.) A sequence ends at a stop token (kept in the response,
``finish_reason="stop"``) or after ``max_new_tokens`` (``"length"``).

Continuous batching: at most ``max_batch_size`` sequences decode together (``None``: every
prompt of the call at once). Each step, finished rows leave the batch and waiting prompts are
prefilled and join it; rows are left-padded in one KV cache (``DynamicCache`` whose layers
append a step in place: ``kv_room``), each with its own attention mask and position ids, and
leading columns no row uses are trimmed.

    step:  admit waiting prompts (prefill) -> sample every row -> drop finished rows
           -> on_step(self) (may update weights) -> one decode forward for the rest

Prefill runs transformers' forward, once per distinct prompt (a GRPO group's n samples share
their keys/values), and the distinct prompts' longest common prefix (a chat template and its
system prompt) once for all of them when that saves enough (``MIN_SHARED_PREFIX_SAVING``):
then each prompt's own suffix is prefilled over the shared keys/values, the padding of shorter
suffixes a hole in the attention mask between the prefix and the suffix. On the default job's
held-out set (128 prompts of ~29 tokens, 17 of them shared) that is 1,600 prefill tokens in
place of 3,800. Decode steps of Llama-family models run ``FastDecoder``
(``fast_decode.py``: the same modules and weights, without transformers' per-layer overhead),
others transformers' forward too.

In-flight updates: ``on_step`` runs between decode steps; when it swaps weights the running
sequences continue with the cached keys/values of the old weights, and every token sampled
after the update (from logits of the new weights) is tagged with the new version
(PipelineRL-style; the KV cache is not recomputed). A prompt admitted after an update is
prefilled with the new weights.

Example: an update to version 1 arriving in ``on_step`` after the third token gives
``token_versions == [0, 0, 0, 1, 1, ...]`` and the sequence goes on from its third token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor

import torch

from streamrl.models import load_causal_lm
from streamrl.workers.engines.base import (
    Engine,
    EngineArgs,
    GenerationOutput,
    SamplingParams,
    StepHook,
)
from streamrl.workers.engines.fast_decode import FastDecoder, MergedProjection, unsupported_reason
from streamrl.workers.engines.kv_room import RoomyLayer, make_roomy
from streamrl.workers.engines.options import HFOptions
from streamrl.workers.engines.packed_linear import PackedLinear, can_prepack, prepack_linears
from streamrl.workers.engines.spare_copies import Positions, SpareCopies

# Prefill the prompts' common prefix once only when that spares at least this many token
# positions: below it the extra forward (one pass over every layer for a single row) costs
# about what it saves.
MIN_SHARED_PREFIX_SAVING = 64


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] -> (tokens [B], logprobs [B]) under the truncated distribution."""
    if params.temperature <= 0:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32, device=logits.device)
    scores = logits.float()
    if params.temperature != 1.0:
        scores = scores / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the mass before it already reaches top_p (keeps at least one).
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return _inverse_cdf_draw(scores, generator)


def _inverse_cdf_draw(
    scores: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One exact draw per row from softmax(scores), and its log-probability.

    One uniform per row against the cumulative mass, found by binary search: ~12x cheaper on
    a CPU than a Gumbel/exponential race, which draws a random number per vocabulary entry
    (18 ms of an 84 ms decode step at 16 rows x 49k vocab, one core). The mass is summed in
    float64 so a token's share of the line is its probability to ~1e-16, and a token of zero
    mass (masked by top-k/top-p) spans an empty interval: it is never drawn."""
    peak = scores.amax(dim=-1, keepdim=True)
    mass = (scores - peak).exp_().double().cumsum_(dim=-1)  # [B, V], mass[:, -1] = total
    total = mass[:, -1:]
    uniform = torch.rand(
        total.shape, generator=generator, dtype=torch.float64, device=scores.device
    )
    # u * total < total, so the search lands on a token of nonzero mass (nextafter guards the
    # rounding of u * total up to total).
    point = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(mass, point, right=True).squeeze(-1)
    logprobs = scores.gather(-1, tokens[:, None]).squeeze(-1) - peak.squeeze(-1)
    return tokens, logprobs - total.squeeze(-1).log().float()


def _full_attention(layer) -> bool:
    """A cache layer that holds every column (no sliding window), so rows can be padded and
    leading columns trimmed."""
    from transformers.cache_utils import DynamicLayer

    return type(layer) in (DynamicLayer, RoomyLayer)


def _shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens of the prompts' longest common prefix worth prefilling once, or 0. Every prompt
    keeps at least one token of its own: its next-token logits come from that token's pass."""
    if len(prompts) < 2:
        return 0
    first, shortest = prompts[0], min(len(p) for p in prompts)
    shared = 0
    while shared < shortest - 1 and all(p[shared] == first[shared] for p in prompts):
        shared += 1
    return shared if (len(prompts) - 1) * shared >= MIN_SHARED_PREFIX_SAVING else 0


def _left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class _Batch:
    """The rows decoding together: row ``r`` is sequence ``seqs[r]`` of the call."""

    def __init__(self, device: torch.device) -> None:
        self.seqs: list[int] = []
        self.cache = None  # DynamicCache, [rows, heads, columns, head_dim] per layer
        self.attention = torch.zeros((0, 0), dtype=torch.long, device=device)  # [rows, columns]
        self.next_pos = torch.zeros(0, dtype=torch.long, device=device)  # [rows]
        self.logits: torch.Tensor | None = None  # [rows, vocab], next-token logits

    def _kv(self):
        return [(layer, layer.keys, layer.values) for layer in self.cache.layers]

    def _resizable(self) -> bool:
        """Rows can be padded and columns trimmed only in full-attention layers (a sliding-window
        layer keeps a running length that padding would break)."""
        return all(_full_attention(layer) for layer in self.cache.layers)

    def join(self, seqs: list[int], cache, attention, next_pos, logits) -> None:
        """Append rows (their own cache) to the batch, left-padding whichever is shorter."""
        if self.cache is None or not self.seqs:
            self.seqs, self.cache, self.attention = list(seqs), cache, attention
            self.next_pos, self.logits = next_pos, logits
            return
        if not self._resizable():
            raise NotImplementedError("continuous batching needs full-attention cache layers")
        width = max(self.attention.shape[1], attention.shape[1])
        pad_old, pad_new = width - self.attention.shape[1], width - attention.shape[1]
        for (layer, k, v), new in zip(self._kv(), cache.layers, strict=True):
            layer.keys = torch.cat([_left_pad(k, pad_old, -2), _left_pad(new.keys, pad_new, -2)])
            layer.values = torch.cat(
                [_left_pad(v, pad_old, -2), _left_pad(new.values, pad_new, -2)]
            )
        self.attention = torch.cat(
            [_left_pad(self.attention, pad_old, 1), _left_pad(attention, pad_new, 1)]
        )
        self.seqs += seqs
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.logits = torch.cat([self.logits, logits])

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` and trim leading columns that no remaining row attends to."""
        index = torch.tensor(rows, dtype=torch.long, device=self.attention.device)
        self.seqs = [self.seqs[r] for r in rows]
        self.attention = self.attention[index]
        self.next_pos = self.next_pos[index]
        self.logits = self.logits[index]
        used = self.attention.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() and self._resizable() else 0
        self.attention = self.attention[:, first:]
        for layer, k, v in self._kv():
            layer.keys, layer.values = k[index, :, first:], v[index, :, first:]


def _attach_float32_logprobs(
    outputs: list[GenerationOutput], step_seqs: list[list[int]], step_logprobs: list[torch.Tensor]
) -> None:
    """Set each output's ``logprobs_f32`` from the float32 tensors the steps sampled with:
    a stable sort by sequence puts every sequence's logprobs together, in step order."""
    if not step_logprobs:
        return
    seqs = torch.tensor([s for rows in step_seqs for s in rows])
    logprobs = torch.cat(step_logprobs).float().cpu()[torch.argsort(seqs, stable=True)]
    data, end = logprobs.numpy().tobytes(), 0
    for out in outputs:
        start, end = end, end + 4 * len(out.response_ids)
        out.logprobs_f32 = data[start:end]


class HFEngine(Engine):
    def __init__(self, args: EngineArgs, options: HFOptions | None = None) -> None:
        options = options or HFOptions()
        self.device = torch.device(args.device)
        self.model = load_causal_lm(args.model_dir, dtype=args.dtype, device=args.device).eval()
        self.model.requires_grad_(False)
        self.params = dict(self.model.named_parameters())
        self._spares = SpareCopies()  # where versions come by their changed elements
        spares = options.spare_copies
        if spares is None:  # where it measured better: an fp32 CPU engine (docs/experiments.md)
            dtype = next(iter(self.params.values())).dtype
            spares = self.device.type == "cpu" and dtype == torch.float32
        self.takes_positions = spares
        # Per parameter name, the packed copies to rebuild when a version changes it.
        self._packed: dict[str, list[PackedLinear | MergedProjection]] = {}
        prepack, fast_decode = options.prepack, options.fast_decode
        if prepack is None:
            prepack = can_prepack(self.model)
        if prepack:
            self._packed = prepack_linears(self.model, rows=options.max_batch_size or 16)
        if fast_decode is None:
            fast_decode = unsupported_reason(self.model) is None
        # After prepacking: the decoder merges the packed projections.
        self._fast = FastDecoder(self.model, self.params) if fast_decode else None
        if self._fast is not None:
            for name, merged in self._fast.merged_by_param.items():
                self._packed.setdefault(name, []).extend(merged)
        self.generator = torch.Generator(device=self.device).manual_seed(args.seed)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.max_batch_size = options.max_batch_size
        self.version = 0

    def shared_weights(self) -> dict[str, torch.Tensor] | None:
        """The live parameter tensors, so that a subscriber writing into them updates the
        engine with no copy; ``None`` on a GPU (the subscriber's image is host memory, and
        ``update_weights`` copies the changed tensors over)."""
        if self.device.type != "cpu" or any(
            p.dtype != torch.bfloat16 for p in self.params.values()
        ):
            return None
        return {name: p.data for name, p in self.params.items()}

    def live_weight_names(self) -> set[str]:
        """Every parameter but the weights of prepacked linears, which a forward reads only
        through their packed copies (a bias it reads: ``PackedLinear.forward``)."""
        names = {id(p): n for n, p in self.params.items()}
        packed = {id(m.source) for m in self.model.modules() if isinstance(m, PackedLinear)}
        live = set()
        for module in self.model.modules():
            for attr, param in module.named_parameters(recurse=False):
                if not (id(module) in packed and attr == "weight"):
                    live.add(id(param))
        return {names[i] for i in live if i in names}

    def weight_groups(self) -> list[frozenset[str]]:
        """Each packed copy's parameters (a ``PackedLinear``'s weight; a merged projection's
        weights and biases) joined with every group they share one with; each other
        parameter alone."""
        names = {id(p): n for n, p in self.params.items()}
        group_of = {name: frozenset([name]) for name in self.params}
        for layers in self._packed.values():
            for layer in layers:
                sources = layer.sources if isinstance(layer, MergedProjection) else [layer.source]
                members = {
                    names[id(p)]
                    for source in sources
                    for p in (source.weight, source.bias)
                    if p is not None and id(p) in names
                }
                merged = frozenset().union(*(group_of[n] for n in members))
                for name in merged:
                    group_of[name] = merged
        return list(set(group_of.values()))

    def prepare_weights(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        version: int,
        pool: Executor | None = None,
        positions: Mapping[str, Positions] | None = None,
    ) -> Callable[[], None]:
        """New tensors for the changed parameters and their packed copies, built while the
        engine decodes; the adoption swaps them in (pointer assignments, no copy). A tensor
        that is the parameter itself (a prepacked weight the thread wrote in place, which no
        forward reads) only gets its packed copies. A parameter with no packed copy whose
        changed ``positions`` are given takes just those, written into its spare
        (``SpareCopies``): about 1-3% of a version's elements change, so an fp32 engine (an
        AVX2 CPU) or a GPU's writes that much, not a whole converted or moved model."""
        with torch.no_grad():
            swaps, new, written = [], {}, []
            for name, tensor in named_tensors:
                param = self.params[name]
                if tensor.data_ptr() == param.data_ptr():
                    written.append(name)
                    continue
                where = None
                if not self._packed.get(name):
                    where = self._spares.positions_for(name, tensor, param, positions)
                if where is None:
                    new[name] = tensor.to(self.device, param.dtype, copy=True)
                else:
                    swaps.append(self._spares.write(name, param, tensor, where))
            by_param = {id(self.params[name]): tensor for name, tensor in new.items()}
            changed = [*new, *written]
            layers = {id(layer): layer for n in changed for layer in self._packed.get(n, ())}

            def pack(layer: PackedLinear | MergedProjection) -> tuple:
                return layer, layer.pack(by_param)

            chosen = list(layers.values())  # each layer's copy apart: on the pool's threads
            packed = list(pool.map(pack, chosen) if pool is not None else map(pack, chosen))

        def adopt() -> None:
            for name, tensor in new.items():
                self.params[name].data = tensor
                self._spares.drop(name)
            for swap in swaps:
                swap()
            for layer, value in packed:
                layer.adopt(value)
            self.version = version

        return adopt

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        stale: dict[int, PackedLinear | MergedProjection] = {}  # each packed copy rebuilt once
        with torch.no_grad():
            for name, tensor in named_tensors:
                param = self.params[name]
                if param.data_ptr() != tensor.data_ptr():  # shared image: already in place
                    param.data.copy_(tensor.to(param.device, param.dtype))
                    self._spares.drop(name)
                for layer in self._packed.get(name, ()):
                    stale[id(layer)] = layer
            for layer in stale.values():
                layer.repack()
        self.version = version

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, on_step: StepHook | None = None
    ) -> list[GenerationOutput]:
        outputs = [GenerationOutput([], [], [], "length") for _ in prompts]
        if params.max_new_tokens <= 0:
            return outputs
        waiting = deque(range(len(prompts)))
        batch = _Batch(self.device)
        stop = set(params.stop_token_ids)
        slots = self.max_batch_size or len(prompts)
        draws = self.generator
        if params.seed is not None:
            draws = torch.Generator(device=self.device).manual_seed(params.seed)
        step_seqs: list[list[int]] = []  # per step: the sequence of each row
        step_logprobs: list[torch.Tensor] = []  # per step: [rows] float32
        while waiting or batch.seqs:
            free = slots - len(batch.seqs)
            if batch.seqs and not batch._resizable():
                free = 0  # sliding-window layers (Gemma3): rows join only an empty batch
            admit = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            if admit:
                batch.join(admit, *self._prefill([prompts[i] for i in admit]))
            tokens, logprobs = sample_tokens(batch.logits, params, draws)
            step_seqs.append(list(batch.seqs))
            step_logprobs.append(logprobs)
            running = []
            for row, (tok, lp) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
                out = outputs[batch.seqs[row]]
                out.response_ids.append(tok)
                out.logprobs.append(lp)
                out.token_versions.append(self.version)
                if tok in stop:
                    out.finish_reason = "stop"
                elif len(out.response_ids) < params.max_new_tokens:
                    running.append(row)
            if len(running) < len(batch.seqs):
                batch.keep(running)
                tokens = tokens[running]
            if not batch.seqs and not waiting:
                break
            if on_step is not None:
                on_step(self)
            if batch.seqs:
                batch.logits = self._decode(batch, tokens)
        _attach_float32_logprobs(outputs, step_seqs, step_logprobs)
        return outputs

    def _prefill(self, prompts: list[list[int]]):
        """Left-padded prefill of new prompts in a cache of their own. A prompt repeated in
        the call (the n samples of a GRPO group) is computed once and its keys/values copied
        to every row that asks for it."""
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        cache, attention, lengths, logits = self._prefill_distinct([list(p) for p in distinct])
        if len(distinct) == len(prompts):
            return cache, attention, lengths, logits
        index = torch.tensor(rows, device=self.device)
        for layer in cache.layers:
            if not _full_attention(layer):  # other layers keep extra per-row state
                return self._prefill_distinct(prompts)
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        return cache, attention[index], lengths[index], logits[index]

    def _prefill_distinct(self, prompts: list[list[int]]):
        """Prefill distinct prompts: their common prefix once (``_shared_prefix_length``) when that
        pays, then every prompt's rest, left-padded, over it."""
        cache = self._empty_cache()
        shared = _shared_prefix_length(prompts)
        if shared and not self._prefill_shared_prefix(prompts[0][:shared], len(prompts), cache):
            cache, shared = self._empty_cache(), 0
        rests = [p[shared:] for p in prompts]
        width = max(len(p) for p in rests)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), shared + width), dtype=torch.long)
        attention[:, :shared] = 1
        for i, rest in enumerate(rests):
            input_ids[i, width - len(rest) :] = torch.tensor(rest)
            attention[i, shared + width - len(rest) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0)[:, shared:],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # only the next-token logits: skips a [B, T, V] projection
        ).logits[:, -1]
        return cache, attention, attention.sum(-1), logits

    def _empty_cache(self):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        make_roomy(cache)  # decode steps append in place (kv_room)
        return cache

    def _prefill_shared_prefix(self, prefix: list[int], rows: int, cache) -> bool:
        """Prefill ``prefix`` once into ``cache`` and make its keys/values ``rows`` rows
        (broadcast views: the next append copies them into a buffer of its own, ``kv_room``).
        False, with ``cache`` left to discard, where a layer keeps per-row state beyond its
        keys and values (sliding windows), which a broadcast would not carry."""
        ids = torch.tensor([prefix], dtype=torch.long, device=self.device)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        if not all(_full_attention(layer) for layer in cache.layers):
            return False
        for layer in cache.layers:
            layer.keys = layer.keys.expand(rows, -1, -1, -1)
            layer.values = layer.values.expand(rows, -1, -1, -1)
        return True

    def _decode(self, batch: _Batch, tokens: torch.Tensor) -> torch.Tensor:
        batch.attention = torch.cat(
            [batch.attention, torch.ones_like(batch.attention[:, :1])], dim=-1
        )
        if self._fast is not None and batch._resizable():
            logits = self._fast.step(tokens, batch.attention, batch.next_pos, batch.cache)
            batch.next_pos = batch.next_pos + 1
            return logits
        logits = self.model(
            input_ids=tokens[:, None],
            attention_mask=batch.attention,
            position_ids=batch.next_pos[:, None],
            past_key_values=batch.cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        batch.next_pos = batch.next_pos + 1
        return logits
