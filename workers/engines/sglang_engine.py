"""The SGLang engine: an in-process ``sglang.Engine`` on one GPU, updated in flight.

Written against SGLang ``SGLANG_VERSION``; ``tests/unit/test_sglang_contract.py`` reads that
wheel's source and checks every class, method, parameter and field used here.

How one ``generate`` call runs::

    caller thread                              engine loop thread (asyncio)
    ─────────────                              ────────────────────────────
    generate(prompts) ──submit──────────────►  one GenerateReqInput per prompt, gathered
    every 20 ms until done: on_step(self)
      └─ update_weights(tensors, v) ─submit─►  pause(in_place) → begin → load → end → continue
         (returns once SGLang has the weights)     (running requests stay, KV cache kept)
    ◄───────────────── list[GenerationOutput] ─┘

Why a loop thread rather than ``loop.run_until_complete`` in ``generate``: ``on_step`` calls the
synchronous ``update_weights`` while generation is running, and a coroutine on the same loop
could not wait for the update. With the loop on its own thread the hook runs on the caller's
thread (where the weight subscriber's sockets live) and the update is one coroutine submitted
to the loop, the same path between ``generate`` calls.

Why the tokenizer manager instead of ``sglang.Engine`` methods: the Engine API has no
``pause_generation``, its ``update_weights_from_tensor`` takes no ``weight_version`` and, unpaused,
waits for every running request to finish (it takes the writer side of ``model_update_lock``,
which each request holds as a reader until it ends), and ``async_generate`` cannot ask for
``return_sampling_mask``. The tokenizer-manager coroutines used here are the ones those Engine
methods wrap.

In-flight semantics (as in PipelineRL): an update pauses the scheduler in place, loads the
tensors with ``flush_cache=False`` and resumes. Requests keep running with their KV cache,
computed by the old weights; new tokens come from the new weights.

Token versions: the scheduler records, for each live request, how many tokens it had when the
weight version changed, and returns per-request spans in ``meta_info["weight_versions"]``
(SGLang's ``weight_version`` is kept equal to ``str(self.version)``). That is exact per
token with ``disable_overlap_schedule=True``. With overlap scheduling (SGLang's default) the
one decode step already launched when the update arrives was computed by the old weights but
is appended after the change is recorded, so it is tagged with the new version. Its behaviour
logprob comes from the same forward as the token and is right either way.

Behaviour logprobs (SGLang's ``layers/sampler.py``): ``output_token_logprobs`` are
``log softmax(logits / T)``, taken after temperature and *before* top-k/top-p truncation
(temperature 1 instead when ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set, so that setting is
refused here). That is the distribution sampled from only when nothing truncates it. So when
top-k, top-p or greedy decoding is on, requests ask for ``return_sampling_mask`` with
``sampling_logprobs_mode="selected"``, and SGLang returns, in
``output_token_sampling_logprobs``, ``log(p_T(token) / p_T(kept set))``: the logprob under the
truncated, renormalised distribution actually sampled from (0.0 for greedy). SGLang accepts
that only with a finite ``top_k`` up to ``sampling_mask_max_tokens`` (default 4096), so
``top_p < 1`` without ``top_k`` is rejected here with a clear error instead of being aborted
request by request.

SGLang also stops at the model's own EOS ids, as well as ``stop_token_ids``; the stop token is
part of ``response_ids``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch

from streamrl.workers.engines.base import (
    SGLANG_INSTALL_HINT,
    Engine,
    GenerationOutput,
    SamplingParams,
    StepHook,
)

SGLANG_VERSION = "0.5.23"
INSTALL_HINT = SGLANG_INSTALL_HINT
ON_STEP_INTERVAL_S = 0.02
GREEDY_TEMPERATURE = 1e-6  # SGLang's _SAMPLING_EPS
# Server args this module sets itself; passing them through **server_args is an error.
RESERVED_SERVER_ARGS = frozenset({"skip_tokenizer_init", "weight_version"})


# ── pure helpers (unit-tested without SGLang) ────────────────────────────────────────────────


def server_kwargs(
    model_path: str,
    *,
    dtype: str,
    mem_fraction_static: float,
    seed: int,
    version: int,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Keyword arguments for ``sglang.Engine`` (= ``ServerArgs`` fields)."""
    clash = RESERVED_SERVER_ARGS & extra.keys()
    if clash:
        raise ValueError(f"SGLangEngine sets {sorted(clash)} itself; do not pass them")
    return {
        "model_path": model_path,
        "dtype": dtype,
        "mem_fraction_static": mem_fraction_static,
        "random_seed": seed,
        "skip_tokenizer_init": True,  # token ids in, token ids out
        "weight_version": str(version),
        **extra,
    }


def is_greedy(params: SamplingParams) -> bool:
    """SGLang decodes greedily (as top_k=1) below this temperature."""
    return params.temperature < GREEDY_TEMPERATURE


def uses_sampling_mask(params: SamplingParams) -> bool:
    """Whether the sampled distribution is truncated (greedy, top-k or top-p), so the exact
    behaviour logprob has to come from SGLang's sampling mask (see the module docstring)."""
    return is_greedy(params) or params.top_k > 0 or params.top_p < 1.0


def check_sampling(params: SamplingParams, mask_max_tokens: int) -> None:
    """Refuse settings whose behaviour logprobs SGLang cannot return exactly."""
    if not uses_sampling_mask(params) or is_greedy(params):
        return
    if not 1 <= params.top_k <= mask_max_tokens:
        raise ValueError(
            f"engine=sglang returns exact behaviour logprobs under top-k/top-p only with "
            f"1 <= top_k <= sampling_mask_max_tokens ({mask_max_tokens}); got "
            f"top_k={params.top_k}, top_p={params.top_p}. Set a finite top_k (with headroom "
            f"for cutoff ties) or raise the server arg sampling_mask_max_tokens."
        )


def sglang_sampling_params(params: SamplingParams) -> dict[str, Any]:
    """streamrl ``SamplingParams`` → SGLang ``sampling_params`` dict (top_k -1 = off).

    min_p and the penalties are pinned to neutral so that a server-wide
    ``preferred_sampling_params`` cannot reshape the distribution the learner assumes."""
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids) or None,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
    }


def generate_request_kwargs(prompt: Sequence[int], params: SamplingParams) -> dict[str, Any]:
    """Fields of one ``GenerateReqInput`` (one prompt, non-streaming)."""
    masked = uses_sampling_mask(params)
    return {
        "input_ids": list(prompt),
        "sampling_params": sglang_sampling_params(params),
        "return_logprob": not masked,
        "return_sampling_mask": masked,
        "sampling_logprobs_mode": "selected" if masked else None,
        "stream": False,
    }


def update_request_kwargs(payloads: list[bytes], version: int) -> dict[str, Any]:
    """Fields of one ``UpdateWeightsFromTensorReqInput``: keep the KV cache, tag the version."""
    return {
        "serialized_named_tensors": payloads,
        "flush_cache": False,
        "weight_version": str(version),
    }


def finish_reason(reason: dict[str, Any] | None) -> str:
    """SGLang's ``meta_info["finish_reason"]`` dict → "stop" | "length" | "abort"."""
    kind = (reason or {}).get("type")
    return kind if kind in ("stop", "length") else "abort"


def token_versions(spans: list[dict[str, Any]]) -> list[int]:
    """``meta_info["weight_versions"]`` spans ({"version", "start", "end"}) → one int per token."""
    versions: list[int] = []
    for span in spans:
        if span["start"] != len(versions):
            raise ValueError(f"weight_versions spans are not contiguous: {spans}")
        versions += [int(span["version"])] * (span["end"] - span["start"])
    return versions


def output_from_sglang(out: dict[str, Any], *, sampling_mask: bool) -> GenerationOutput:
    """One finished SGLang output (``{"output_ids", "meta_info"}``) → ``GenerationOutput``."""
    meta = out["meta_info"]
    ids = list(out["output_ids"])
    if sampling_mask:
        logprobs = [float(lp) for lp in meta.get("output_token_sampling_logprobs", [])]
    else:
        entries = meta.get("output_token_logprobs", [])  # (logprob, token_id, text)
        if [entry[1] for entry in entries] != ids[: len(entries)]:
            raise ValueError("SGLang output_token_logprobs do not match output_ids")
        logprobs = [float(entry[0]) for entry in entries]
    versions = token_versions(meta.get("weight_versions", []))
    reason = finish_reason(meta.get("finish_reason"))
    n = len(ids)
    if reason == "abort":  # an aborted request may stop between the per-token streams
        n = min(n, len(logprobs), len(versions))
    elif not len(logprobs) == len(versions) == n:
        raise ValueError(
            f"SGLang returned {n} tokens, {len(logprobs)} logprobs, {len(versions)} versions"
        )
    return GenerationOutput(
        response_ids=ids[:n],
        logprobs=logprobs[:n],
        token_versions=versions[:n],
        finish_reason=reason,
        extra={"sglang_finish_reason": meta.get("finish_reason")},
    )


def _check_ok(result: tuple[bool, str], what: str) -> None:
    success, message = result[0], result[1]
    if not success:
        raise RuntimeError(f"SGLang {what} failed: {message}")


# ── the engine ───────────────────────────────────────────────────────────────────────────────


class SGLangEngine(Engine):
    """``sglang.Engine`` behind streamrl's engine interface; see the module docstring.

    Example: generating at version 3, ``on_step`` calls ``update_weights(diff, version=4)``
    after a sequence has 5 tokens; SGLang records the change and the sequence comes back with
    ``token_versions == [3, 3, 3, 3, 3, 4, 4, ...]`` (give or take the one in-flight step
    under overlap scheduling).
    """

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bfloat16",
        mem_fraction_static: float = 0.8,
        seed: int = 0,
        **server_args: Any,
    ) -> None:
        try:
            import sglang
            from sglang.srt.managers import io_struct
            from sglang.srt.utils import MultiprocessingSerializer
        except ImportError as exc:
            raise RuntimeError(INSTALL_HINT) from exc
        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true"):
            raise RuntimeError(
                "SGLANG_RETURN_ORIGINAL_LOGPROB makes SGLang return temperature-1 logprobs, "
                "not the behaviour logprobs streamrl needs; unset it"
            )
        self._io = io_struct
        self._serialize = MultiprocessingSerializer.serialize
        kwargs = server_kwargs(
            model_path,
            dtype=dtype,
            mem_fraction_static=mem_fraction_static,
            seed=seed,
            version=self.version,
            extra=server_args,
        )
        self._engine = sglang.Engine(**kwargs)
        self._tokenizer_manager = self._engine.tokenizer_manager
        self._tp_size = int(self._engine.server_args.tp_size)
        self._mask_max_tokens = int(self._engine.server_args.sampling_mask_max_tokens)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._run_loop, name="sglang-engine-loop", daemon=True
        )
        self._loop_thread.start()
        self._closed = False

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, on_step: StepHook | None = None
    ) -> list[GenerationOutput]:
        self._require_open()
        check_sampling(params, self._mask_max_tokens)
        done = asyncio.run_coroutine_threadsafe(self._generate_all(prompts, params), self._loop)
        try:
            while not concurrent.futures.wait([done], timeout=ON_STEP_INTERVAL_S).done:
                if on_step is not None:
                    on_step(self)
        except BaseException:
            done.cancel()  # SGLang aborts the requests it had been sent
            raise
        return done.result()

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Load full tensors by HF checkpoint name (CPU tensors travel through shared memory,
        CUDA tensors through CUDA IPC). Returns once every TP rank has them."""
        self._require_open()
        # One payload per TP rank, as sglang.Engine does: each rank releases only its own.
        payloads = [self._serialize(named_tensors) for _ in range(self._tp_size)]
        request = self._io.UpdateWeightsFromTensorReqInput(
            **update_request_kwargs(payloads, version)
        )
        asyncio.run_coroutine_threadsafe(self._apply_update(request), self._loop).result()
        self.version = version

    def shutdown(self) -> None:
        """Stop SGLang (which kills every child process of this process) and the loop thread."""
        if self._closed:
            return
        self._closed = True
        self._engine.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=10)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        # Stopped by shutdown(): cancel what is left (SGLang's output reader) and close.
        leftovers = asyncio.all_tasks(self._loop)
        for task in leftovers:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
        self._loop.close()

    def _require_open(self) -> None:
        if self._closed:  # the loop thread is gone: a submitted coroutine would never run
            raise RuntimeError("SGLangEngine is shut down")

    async def _generate_all(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[GenerationOutput]:
        return list(await asyncio.gather(*(self._generate_one(p, params) for p in prompts)))

    async def _generate_one(self, prompt: list[int], params: SamplingParams) -> GenerationOutput:
        request = self._io.GenerateReqInput(**generate_request_kwargs(prompt, params))
        # Run the generator to its end: it holds model_update_lock until it returns.
        async for out in self._tokenizer_manager.generate_request(request):
            final = out
        return output_from_sglang(final, sampling_mask=uses_sampling_mask(params))

    async def _apply_update(self, request: Any) -> None:
        io, manager = self._io, self._tokenizer_manager
        try:
            # Paused, the update skips model_update_lock, so running requests need not finish.
            await manager.pause_generation(io.PauseGenerationReqInput(mode="in_place"))
            _check_ok(await manager.begin_weight_update(io.BeginWeightUpdateReqInput()), "begin")
            try:
                loaded = await manager.update_weights_from_tensor(request)
            finally:
                ended = await manager.end_weight_update(io.EndWeightUpdateReqInput())
            _check_ok(loaded, "update_weights_from_tensor")
            _check_ok(ended, "end_weight_update")
        finally:
            await manager.continue_generation(
                io.ContinueGenerationReqInput(torch_empty_cache=False)
            )
