"""One behavioural contract for every generation engine of the registry (``hf``, ``vllm``;
``sglang`` where it is installed with a GPU) and for one registered from outside streamrl
(``engines_for_tests:RenamedHF``, reached as ``module:Class``), each built as a generator
builds it (``make_engine``), on the real default model (SmolLM2-135M-Instruct: Llama, tied
embeddings), in the compute dtype the run would pick on this machine.

- At staleness 0 the learner's logprobs on the engine's samples equal the behaviour logprobs to
  the noise level docs/algorithms.md gives for the dtype.
- An update applied mid-generation tags the tokens before and after it with their versions and
  aborts nothing.
- After a partial update (some tensors, tied embeddings and one part of a fused q/k/v among
  them) the engine samples exactly what an engine loaded fresh with the new weights samples
  under the same seed: same tokens, same logprobs, i.e. the same next-token distributions.
- Stop tokens, max tokens and finish reasons follow one rule on every engine.
- An update prepared off the decode path (``prepare_weights``, on another thread while the
  engine samples) changes nothing until adopted, then samples as ``update_weights`` would.
- vLLM: after an update, the weights its own kernels compute with equal the host image
  (checksummed); a call vLLM refuses leaves no request behind; a reload vLLM does not carry
  out is logged and raised.

The architecture-dependent tests (``ARCH_TESTS``: staleness-0 logprobs, an update
mid-generation, a partial update against a fresh engine, a prepared update) also run on the
small random models of ``streamrl.models.tiny`` (Qwen2's q/k/v biases, Qwen3's q/k norms,
Gemma3's scaled embeddings and sliding-window layers, Mistral, Phi-3's fused qkv/gate_up
tensors, Qwen3-MoE's experts), on each engine ``ENGINES_SERVING`` lists for the model (vLLM
refuses the MoE at launch: that refusal is ``test_tiny_models``' to check, not a case here).

Only the cases that apply are generated (``cases``): every test on every engine on SmolLM2,
the vLLM internals on vLLM only, the architecture tests on the pairs above. A case skips for
one reason only: its engine cannot run on this machine at all (``absent_here``): vLLM not
installed, or SGLang not installed or no CUDA GPU (SGLang runs on CUDA only; CI has neither).
Any other refusal of a generated case (``unusable_reason``) fails it: the tables are wrong.

References are the learner's own scoring (``losses.token_logprobs`` on a full-sequence forward of
the bf16 image) and a second engine of the same kind built from a checkpoint on disk.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
from support import learner_logprobs

from streamrl.config import GeneratorConfig
from streamrl.hardware import resolve_compute_dtype
from streamrl.models import SMOLLM2, load_causal_lm, load_tokenizer, resolve_model
from streamrl.models.tiny import ARCHITECTURES, ENGINES_SERVING
from streamrl.workers.engines import ENGINES, make_engine
from streamrl.workers.engines.base import Engine, SamplingParams
from streamrl.workers.engines.registry import resolve_engine
from streamrl.workers.weight_codec import as_i16, checksum

# Noise levels of docs/algorithms.md (sync mode, SmolLM2-135M), with headroom for 128 tokens.
NOISE = {"bfloat16": (0.06, 0.6), "float32": (1e-3, 1e-2)}  # (mean |Δ|, max |Δ|)
QUESTIONS = ["What is 12 + 7?", "What is 30 - 4?", "Name a colour.", "What is 3 + 25?"]
PRELOAD_BEFORE = os.environ.get("LD_PRELOAD")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Every registered engine, and one from a test module (tests/integration/engines_for_tests.py).
KINDS = [*ENGINES, "engines_for_tests:RenamedHF"]
# Options of the contract's engines (max_model_len is 512: a KV cache of 128 MiB holds it;
# the test module's engine decodes its own keys, which the HF engine's schema would refuse).
OPTIONS = {"vllm": {"kv_cache_mb": 128}, "engines_for_tests:RenamedHF": {"rows": 8}}
# The tests that depend on the architecture; the rest (engine mechanics) run on SmolLM2 only,
# and so does the renamed HF engine (the HF engine under another name).
ARCH_TESTS = {
    "test_staleness_zero_logprobs_match_the_learner",
    "test_update_mid_generation_tags_versions_and_aborts_nothing",
    "test_partial_update_equals_a_fresh_engine",
    "test_a_prepared_update_changes_nothing_until_adopted",
}
ARCH_KINDS = ("hf", "vllm")
# The tests of vLLM's own engine core (in-process): vLLM only.
VLLM_TESTS = {
    "test_a_refused_call_leaves_no_request_in_the_engine",
    "test_a_reload_vllm_does_not_carry_out_is_logged_and_raised",
}


def cases(test: str) -> list[tuple[str, str]]:
    """The (model, engine) pairs ``test`` holds to the contract: SmolLM2 on every engine the
    test concerns, then for an architecture test each small random model on each engine of
    ``ARCH_KINDS`` that serves it (``ENGINES_SERVING``)."""
    kinds = ["vllm"] if test in VLLM_TESTS else KINDS
    pairs = [(SMOLLM2, kind) for kind in kinds]
    if test in ARCH_TESTS:
        pairs += [
            (model, kind)
            for model in ARCHITECTURES
            for kind in ARCH_KINDS
            if kind in ENGINES_SERVING[model]
        ]
    return pairs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test's cases, as module-scoped parameters: pytest groups the tests by their
    values, so each (model, engine) is built once for the tests that share it."""
    pairs = cases(metafunc.definition.originalname)
    metafunc.parametrize(
        ("model_name", "kind"),
        pairs,
        indirect=True,
        scope="module",
        ids=[f"{kind}-{model}" for model, kind in pairs],
    )


def absent_here(kind: str) -> str | None:
    """Why ``kind`` cannot run on this machine at all, whatever the model: its package is not
    installed, or (SGLang) there is no CUDA GPU. The one reason a case skips."""
    if kind in ("vllm", "sglang") and importlib.util.find_spec(kind) is None:
        return f"{kind} is not installed here"
    if kind == "sglang" and DEVICE != "cuda":
        return "SGLang runs on a CUDA GPU only"
    return None


def build(kind: str, model_dir: Path, dtype: str, seed: int = 0) -> Engine:
    """The engine as a generator makes it: through the registry, options decoded by its schema."""
    config = GeneratorConfig(engine=kind, device=DEVICE, engine_options=OPTIONS.get(kind, {}))
    return make_engine(config, model_dir, seed, compute_dtype=dtype, max_model_len=512)


@pytest.fixture(scope="module")
def model_name(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model_dir(model_name) -> Path:
    return resolve_model(model_name)


def learner_image(model_dir: Path) -> dict[str, torch.Tensor]:
    """The bf16 image by the learner's parameter names (what the weight stream carries; the
    checkpoint's names too, except where transformers fuses tensors on load: MoE experts)."""
    model = load_causal_lm(model_dir, dtype="bfloat16")
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _pick(image: dict[str, torch.Tensor], preferred: str, *parts: str) -> str:
    """``preferred`` where the model has it (SmolLM2's), else the last tensor whose name
    holds every one of ``parts`` (the last layer's)."""
    if preferred in image:
        return preferred
    return [n for n in image if all(p in n for p in parts)][-1]


@pytest.fixture(scope="module")
def dtype() -> str:
    return resolve_compute_dtype("auto", DEVICE)  # what a run would pick here


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[list[int]]:
    from streamrl.data import Prompt
    from streamrl.models import encode_prompt

    tokenizer = load_tokenizer(model_dir)
    return [
        encode_prompt(tokenizer, Prompt(q, [{"role": "user", "content": q}], "0", "x"), 128)
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def kind(request, model_name, model_dir) -> str:
    absent = absent_here(request.param)
    if absent:
        pytest.skip(absent)
    reason = resolve_engine(request.param).unusable_reason(model_dir, DEVICE)
    assert reason is None, f"{request.param} refuses {model_name}, a case of this suite: {reason}"
    return request.param


@pytest.fixture(scope="module")
def engine(kind, model_dir, dtype):
    # Built where numba (llvmlite) is loaded, as in a test process that encoded weights before:
    # vLLM's construction scans every module (``vllm_engine.llvmlite_scannable``).
    from streamrl.workers.diff_kernels import compile_kernels

    compile_kernels()
    eng = build(kind, model_dir, dtype)
    yield eng
    eng.shutdown()


def test_building_an_engine_leaves_what_child_processes_inherit(engine):
    """vLLM's CPU platform writes LD_PRELOAD (tcmalloc, libgomp) into os.environ; every
    process started later (Ray roles, process groups) would inherit it."""
    assert os.environ.get("LD_PRELOAD") == PRELOAD_BEFORE


def test_staleness_zero_logprobs_match_the_learner(engine, kind, model_dir, dtype, prompts):
    params = SamplingParams(temperature=0.8, max_new_tokens=16)
    outputs = engine.generate([p for p in prompts for _ in range(2)], params)
    learner = load_causal_lm(model_dir, dtype=dtype, device=DEVICE).eval()
    diffs = []
    with torch.no_grad():
        for prompt, out in zip([p for p in prompts for _ in range(2)], outputs, strict=True):
            assert len(out.response_ids) == len(out.logprobs) == len(out.token_versions) > 0
            assert set(out.token_versions) == {engine.version}
            reference = learner_logprobs(learner, prompt, out.response_ids, params.temperature)
            diffs.append((torch.tensor(out.logprobs) - reference).abs())
    diff = torch.cat(diffs)
    mean_bound, max_bound = NOISE[dtype]
    assert diff.mean() < mean_bound and diff.max() < max_bound, (kind, diff.mean(), diff.max())


def test_update_mid_generation_tags_versions_and_aborts_nothing(engine, kind, model_dir, prompts):
    base = engine.version
    image = learner_image(model_dir)
    name = _pick(image, "model.layers.5.mlp.down_proj.weight", "down_proj")
    calls = []

    def on_step(eng: Engine) -> None:
        calls.append(None)
        if len(calls) == 3:  # three tokens sampled so far (stepwise engines)
            eng.update_weights([(name, image[name] * 1.01)], version=base + 1)

    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    outputs = engine.generate(prompts, params, on_step)
    for out in outputs:
        assert out.finish_reason == "length" and len(out.response_ids) == 12
        switch = out.token_versions.index(base + 1)
        assert out.token_versions == [base] * switch + [base + 1] * (12 - switch)
        if resolve_engine(kind).stepwise:  # on_step once per sampled token
            assert switch == 3
    # Back to the checkpoint's weights for the tests after this one.
    engine.update_weights(list(image.items()), version=base + 2)


def test_partial_update_equals_a_fresh_engine(engine, kind, model_dir, dtype, prompts, tmp_path):
    original = learner_image(model_dir)
    changed = [
        "model.embed_tokens.weight",  # tied to the LM head (SmolLM2, Qwen2, Gemma3)
        # one part of a fused q/k/v (Phi-3: the fused tensor itself)
        _pick(original, "model.layers.7.self_attn.q_proj.weight", "self_attn.q", "proj.weight"),
        _pick(original, "model.layers.3.mlp.down_proj.weight", "down_proj"),  # MoE: experts'
        "model.layers.0.input_layernorm.weight",
    ]
    gen = torch.Generator().manual_seed(0)
    new = dict(original)
    for name in changed:
        noise = 1 + 0.05 * torch.randn(original[name].shape, generator=gen)
        new[name] = (original[name].float() * noise).to(torch.bfloat16)
    fresh_dir = tmp_path / "model"
    shutil.copytree(model_dir, fresh_dir)
    # Saved as transformers saves it (an export does): checkpoint names, experts split again.
    fresh_model = load_causal_lm(model_dir, dtype="bfloat16")
    with torch.no_grad():
        for name, param in fresh_model.named_parameters():
            param.copy_(new[name])
    fresh_model.save_pretrained(fresh_dir, safe_serialization=True)

    engine.update_weights(list(original.items()), version=engine.version + 1)  # a known start
    engine.update_weights([(n, new[n]) for n in changed], version=engine.version + 1)
    if kind == "vllm":
        assert_vllm_computes_with(engine, new)
    fresh = build(kind, fresh_dir, dtype)
    try:
        if resolve_engine(kind).seeded:  # else greedy: the same tokens without a seed
            params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=1234)
        else:
            params = SamplingParams(temperature=0.0, max_new_tokens=12)
        updated_out = engine.generate(prompts, params)
        fresh_out = fresh.generate(prompts, params)
    finally:
        fresh.shutdown()
    for a, b in zip(updated_out, fresh_out, strict=True):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(
            torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0
        )
    engine.update_weights(list(original.items()), version=engine.version + 1)


def test_a_prepared_update_changes_nothing_until_adopted(engine, kind, model_dir, prompts):
    """``prepare_weights`` runs on the weight thread while the engine decodes: the samples of
    a call during it are those of the weights held; once adopted, those of ``update_weights``
    with the same tensors."""
    original = learner_image(model_dir)
    changed = [
        "model.embed_tokens.weight",
        _pick(original, "model.layers.7.self_attn.q_proj.weight", "self_attn.q", "proj.weight"),
        _pick(original, "model.layers.2.mlp.up_proj.weight", "up_proj"),
    ]
    gen = torch.Generator().manual_seed(1)
    new = {
        n: (original[n].float() * (1 + 0.05 * torch.randn(original[n].shape, generator=gen))).to(
            torch.bfloat16
        )
        for n in changed
    }
    if resolve_engine(kind).seeded:
        params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=77)
    else:
        params = SamplingParams(temperature=0.0, max_new_tokens=8)

    def sample() -> list[tuple[list[int], list[float]]]:
        return [(o.response_ids, o.logprobs) for o in engine.generate(prompts, params)]

    engine.update_weights(list(original.items()), version=engine.version + 1)
    before = sample()
    engine.update_weights([(n, new[n]) for n in changed], version=engine.version + 1)
    updated = sample()
    engine.update_weights(list(original.items()), version=engine.version + 1)

    target = engine.version + 1
    prepared: list = []
    thread = threading.Thread(
        target=lambda: prepared.append(engine.prepare_weights(list(new.items()), target))
    )
    thread.start()
    during = sample()  # while the thread prepares (or right after: held weights either way)
    thread.join()
    assert engine.version == target - 1
    assert _same_samples(during, before)
    prepared[0]()
    assert engine.version == target
    assert _same_samples(sample(), updated)
    engine.update_weights(list(original.items()), version=engine.version + 1)


def _same_samples(a: list, b: list) -> bool:
    return all(
        ta == tb and torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-5, rtol=0)
        for (ta, la), (tb, lb) in zip(a, b, strict=True)
    )


def test_stop_tokens_max_tokens_and_finish_reasons(engine, prompts):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    free = engine.generate(prompts, greedy)
    for prompt, out in zip(prompts, free, strict=True):
        assert len(out.response_ids) == 10 and out.finish_reason == "length"
        assert out.logprobs == [0.0] * 10  # greedy: the wire's convention
        # Stopping on the first occurrence of a token cuts the response right after it.
        at = max(i for i, t in enumerate(out.response_ids) if t not in out.response_ids[:i])
        stop = out.response_ids[at]
        params = SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop,))
        (stopped,) = engine.generate([prompt], params)
        assert stopped.response_ids == out.response_ids[: at + 1]
        assert stopped.finish_reason == "stop"
        # A stop token that is also the last allowed token: "stop" wins.
        edge = SamplingParams(temperature=0.0, max_new_tokens=at + 1, stop_token_ids=(stop,))
        (both,) = engine.generate([prompt], edge)
        assert both.finish_reason == "stop" and both.response_ids == stopped.response_ids
    short = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=3))
    for out, whole in zip(short, free, strict=True):
        assert out.response_ids == whole.response_ids[:3] and out.finish_reason == "length"


def test_episodes_match_the_learner_on_every_policy_token(engine, kind, model_dir, dtype):
    """Multi-turn episodes (the guessing game, three turns) on the engine: each turn is
    sampled from the prompt and every token before it, the environment's included, so the
    learner's one forward over the whole episode matches the behaviour logprobs on every
    policy token, at the dtype's noise level."""
    from streamrl.config import load_config
    from streamrl.models import stop_token_ids
    from streamrl.tasks import TASKS
    from streamrl.workers.generation.episodes import EpisodeRunner

    config = load_config(
        None, ["data.source=guess", "env.name=guess", "rewards=[]", "env.max_turns=3"]
    )
    tokenizer = load_tokenizer(model_dir)
    prompts = [TASKS["guess"].question(config.data, 0, i, "train") for i in range(2)]
    params = SamplingParams(
        temperature=0.8, max_new_tokens=8, stop_token_ids=stop_token_ids(tokenizer)
    )
    runner = EpisodeRunner(config, tokenizer)
    try:
        episodes = runner.play(engine, prompts, 2, params)
    finally:
        runner.close()
    assert any(e.turns > 1 for e in episodes), [runner.text(e) for e in episodes]
    learner = load_causal_lm(model_dir, dtype=dtype, device=DEVICE).eval()
    diffs = []
    with torch.no_grad():
        for e in episodes:
            assert len(e.response_ids) == len(e.logprobs) == len(e.versions) == len(e.action_mask)
            reference = learner_logprobs(learner, e.prompt_ids, e.response_ids, 0.8)
            policy = torch.tensor(e.action_mask, dtype=torch.bool)
            diffs.append((torch.tensor(e.logprobs)[policy] - reference[policy]).abs())
    diff = torch.cat(diffs)
    mean_bound, max_bound = NOISE[dtype]
    assert diff.mean() < mean_bound and diff.max() < max_bound, (kind, diff.mean(), diff.max())


def _read_vllm_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """vLLM's parameters as its kernels compute with them. On CPU a linear layer's (and the LM
    head's) only copy is the kernel's prepacked one, so those are read through the kernel:
    the identity times W^T is W^T exactly (one nonzero product per output)."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    out = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LinearBase):
                width = module.input_size_per_partition
            elif isinstance(module, ParallelLMHead):
                width = module.embedding_dim
            else:
                continue
            eye = torch.eye(width, dtype=module.weight.dtype, device=module.weight.device)
            out[f"{name}.weight"] = module.quant_method.apply(module, eye).T.cpu()
        for name, param in model.named_parameters():
            if param.numel() and name not in out:
                out[name] = param.detach().cpu().clone()
    return out


def assert_vllm_computes_with(engine: Engine, image: dict[str, torch.Tensor]) -> None:
    """Checksum each checkpoint tensor of ``image`` against the engine's own copy: vLLM's
    model in the engine core, fused layers (q/k/v, gate/up) cut into their parts, and a tied
    LM head's own copy against the embedding."""
    own = engine.llm.apply_model(_read_vllm_weights)[0]
    packed = engine.llm.apply_model(lambda m: dict(getattr(m, "packed_modules_mapping", {})))[0]
    fused_of = {part: fused for fused, parts in packed.items() for part in parts}
    expected = dict(image)
    if "lm_head.weight" not in image and "lm_head.weight" in own:  # tied, a head of its own
        expected["lm_head.weight"] = image["model.embed_tokens.weight"]
    wrong = []
    for name, tensor in expected.items():
        module, _, param = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        row = 0
        if leaf in fused_of:
            parts = packed[fused_of[leaf]]
            row = sum(image[f"{parent}.{p}.{param}"].shape[0] for p in parts[: parts.index(leaf)])
            module = f"{parent}.{fused_of[leaf]}"
        held = own[f"{module}.{param}"][row : row + tensor.shape[0], ...]
        if checksum(as_i16(held.to(torch.bfloat16))) != checksum(as_i16(tensor)):
            wrong.append(name)
    assert not wrong, wrong


def test_a_refused_call_leaves_no_request_in_the_engine(engine, prompts):
    """vLLM refuses a prompt longer than its max_model_len when it is added; the rows added
    before it must not stay in the engine (the next call would step them)."""
    too_long = [prompts[0][0]] * 600  # the contract's engines are built with max_model_len=512
    with pytest.raises(Exception, match="maximum context length"):
        engine.generate([prompts[0], prompts[1], too_long], SamplingParams(max_new_tokens=4))
    assert not engine.engine.has_unfinished_requests()
    outputs = engine.generate(prompts[:2], SamplingParams(temperature=0.0, max_new_tokens=4))
    assert [len(o.response_ids) for o in outputs] == [4, 4]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_reload_vllm_does_not_carry_out_is_logged_and_raised(engine, model_dir, caplog):
    """vLLM warns "Failed to load weights" for every layer a partial reload leaves alone; the
    engine keeps those lines out and reports, by name, a layer it sent that vLLM did not load
    (here: a model whose weight loader skips one name, as a renamed tensor would be)."""
    from safetensors.torch import load_file

    original = load_file(str(model_dir / "model.safetensors"))
    name = "model.layers.3.mlp.down_proj.weight"
    reload_loggers = [
        logging.getLogger(f"vllm.model_executor.model_loader.reload.{n}")
        for n in ("layerwise", "inplace")
    ]
    seen = _Records()
    for logger in reload_loggers:
        logger.addHandler(seen)
    try:
        engine.update_weights([(name, original[name] * 1.01)], version=engine.version + 1)
        assert [r.getMessage() for r in seen.records] == []  # a partial reload is not a failure

        def skip_down_proj(model: torch.nn.Module) -> None:
            load = type(model).load_weights.__get__(model)
            model.load_weights = lambda weights: load(
                (n, t) for n, t in weights if "layers.3.mlp.down_proj" not in n
            )

        engine.llm.apply_model(skip_down_proj)
        caplog.set_level(logging.ERROR, logger="streamrl.workers.engines.vllm_engine")
        with pytest.raises(RuntimeError, match="layers.3.mlp.down_proj.weight"):
            engine.update_weights([(name, original[name] * 1.02)], version=engine.version + 1)
        assert [r.levelno for r in caplog.records if "down_proj" in r.getMessage()] == [
            logging.ERROR
        ]
    finally:
        for logger in reload_loggers:
            logger.removeHandler(seen)
        engine.llm.apply_model(lambda model: model.__dict__.pop("load_weights", None))
    engine.update_weights(list(original.items()), version=engine.version + 1)
    assert_vllm_computes_with(engine, original)


def test_lora_adapters_merged_in_flight_match_the_learner(
    engine, kind, model_dir, dtype, prompts, tmp_path
):
    """LoRA reaches every engine as merged weights through ``update_weights``
    (``streamrl.models.lora.LoraMerge``): an adapter version applied mid-generation tags the
    tokens as any update does, and at staleness 0 the engine's logprobs equal those of the
    learner's peft model (computing with the merged weight, ``merge_in_forward``) to the
    dtype's noise level, while they differ from the base model's by far more (the adapter is
    not lost in the merge)."""
    from safetensors.torch import load_file

    from streamrl.models.lora import (
        AdapterSettings,
        LoraMerge,
        adapter_shapes,
        fresh_adapter,
        save_adapter,
    )
    from streamrl.models.lora import attach_adapter as peft_wrap
    from streamrl.workers.learning.lora_forward import merge_in_forward

    settings = AdapterSettings(r=8, alpha=16.0, target_modules="all-linear")
    adapters = fresh_adapter(adapter_shapes(model_dir, settings), seed=0)
    gen = torch.Generator().manual_seed(1)
    for name, tensor in adapters.items():
        if ".lora_B." in name:  # a trained adapter: B away from its zero start
            adapters[name] = (0.05 * torch.randn(tensor.shape, generator=gen)).to(torch.bfloat16)
    save_adapter(adapters, settings, str(model_dir), tmp_path)
    merged = LoraMerge(model_dir, adapters, settings).merged(adapters)

    original = load_file(str(model_dir / "model.safetensors"))
    engine.update_weights(list(original.items()), version=engine.version + 1)  # a known start
    version = engine.version + 1
    calls = []

    def on_step(eng: Engine) -> None:
        calls.append(None)
        if len(calls) == 2:
            eng.update_weights(merged, version=version)

    outputs = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=6), on_step)
    for out in outputs:
        assert out.finish_reason == "length" and out.token_versions[-1] == version
        assert sorted(out.token_versions) == out.token_versions  # old, then new: no abort

    params = SamplingParams(temperature=0.8, max_new_tokens=16)
    samples = engine.generate([p for p in prompts for _ in range(2)], params)
    base = load_causal_lm(model_dir, dtype=dtype, device=DEVICE).eval()
    learner = peft_wrap(
        load_causal_lm(model_dir, dtype=dtype, device=DEVICE), tmp_path, settings, False
    ).eval()
    assert merge_in_forward(learner) > 0  # the learner's forward, as a LoRA run trains it
    to_learner, to_base = [], []
    with torch.no_grad():
        for prompt, out in zip([p for p in prompts for _ in range(2)], samples, strict=True):
            assert set(out.token_versions) == {version}
            got = torch.tensor(out.logprobs)
            to_learner.append(
                (got - learner_logprobs(learner, prompt, out.response_ids, 0.8)).abs()
            )
            to_base.append((got - learner_logprobs(base, prompt, out.response_ids, 0.8)).abs())
    diff, off_base = torch.cat(to_learner), torch.cat(to_base)
    mean_bound, max_bound = NOISE[dtype]
    assert diff.mean() < mean_bound and diff.max() < max_bound, (kind, diff.mean(), diff.max())
    assert off_base.mean() > 3 * diff.mean(), (kind, off_base.mean(), diff.mean())
    engine.update_weights(list(original.items()), version=engine.version + 1)
