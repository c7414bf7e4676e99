"""The SGLang engine's contract with SGLang, checked without SGLang installed.

SGLang runs only on CUDA machines, so CI cannot import it. Instead these tests parse SGLang's
source with ``ast`` and assert that every class, method, parameter and field the engine uses
exists there. The source is the installed package's where ``import sglang`` works (a GPU
machine with the ``sglang`` extra: the tests run there with no flag), else the pinned wheel's
(``SGLANG_VERSION`` in ``sglang_engine``; downloaded with ``--network``, cached under
``~/.cache/streamrl/sglang-wheel/``). The keyword arguments are taken from the engine's own
pure helpers, so a new argument is checked as soon as it is passed. Without SGLang and
without ``--network`` the source tests skip; the others run.

The last tests drive the real ``SGLangEngine`` against a fake ``sglang`` (a tokenizer manager
that decodes on a timer and records version changes as SGLang's scheduler does), to check the
loop thread, the hook cadence and the pause → begin → load → end → continue sequence.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from streamrl.workers.engines.base import Engine, SamplingParams
from streamrl.workers.engines.sglang_engine import (
    SGLANG_VERSION,
    SGLangEngine,
    check_sampling,
    finish_reason,
    generate_request_kwargs,
    output_from_sglang,
    server_kwargs,
    sglang_sampling_params,
    token_versions,
    update_request_kwargs,
    uses_sampling_mask,
)

WHEEL_CACHE = Path.home() / ".cache" / "streamrl" / "sglang-wheel"
# Pinned so the download is the same wheel from any host (SGLang ships binary wheels only).
WHEEL_PLATFORM = ("manylinux_2_34_x86_64", "3.11")


def _installed_package() -> Path | None:
    """The installed ``sglang`` package's folder, found without importing it; None without."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


INSTALLED = _installed_package()
# The tests that read SGLang's source: where it is installed they run as any test does; else
# they need the package index for the wheel (``network``: skipped unless --network).
reads_sglang = pytest.mark.usefixtures("src") if INSTALLED else pytest.mark.network


# ── reading the wheel ────────────────────────────────────────────────────────────────────────


def _download_wheel() -> Path:
    found = sorted(WHEEL_CACHE.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    platform, python = WHEEL_PLATFORM
    with tempfile.TemporaryDirectory(dir=WHEEL_CACHE) as tmp:
        # Download into a temporary folder, then move: an interrupted run leaves no half wheel.
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--platform", platform, "--python-version", python, "--quiet",
            f"sglang=={SGLANG_VERSION}", "-d", tmp,
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot download sglang=={SGLANG_VERSION}: {exc}")
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            reason = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            pytest.skip(f"cannot download sglang=={SGLANG_VERSION}: {reason}")
        target = WHEEL_CACHE / wheels[0].name
        os.replace(wheels[0], target)
    return target


class Source:
    """Files of one SGLang release by their paths in its wheel (``sglang/srt/...``), Python
    files parsed on demand: the installed package's or the pinned wheel's, read alike."""

    def __init__(self, label: str, names: set[str], read: Callable[[str], bytes]) -> None:
        self.label = label  # "the sglang 0.5.23 wheel", named in every failure
        self._names = names
        self._read = read

    @classmethod
    def wheel(cls, path: Path) -> Source:
        archive = zipfile.ZipFile(path)
        return cls(f"the sglang {SGLANG_VERSION} wheel", set(archive.namelist()), archive.read)

    @classmethod
    def installed(cls, package: Path) -> Source:
        root = package.parent  # site-packages: paths below it are the wheel's paths
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            version = "(version unknown)"
        names = {f.relative_to(root).as_posix() for f in package.rglob("*") if f.is_file()}
        return cls(
            f"the installed sglang {version} ({package})",
            names,
            lambda name: (root / name).read_bytes(),
        )

    def text(self, path: str) -> str:
        assert path in self._names, f"{path} is not in {self.label}"
        return self._read(path).decode()

    @cache  # noqa: B019 - one Source per session
    def tree(self, path: str) -> ast.Module:
        return ast.parse(self.text(path))

    def files_under(self, folder: str) -> list[str]:
        return sorted(n for n in self._names if n.startswith(folder) and n.endswith(".py"))

    def cls(self, path: str, name: str) -> ast.ClassDef:
        for node in self.tree(path).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        raise AssertionError(f"class {name} not found in {path}")


@pytest.fixture(scope="module")
def src() -> Source:
    return Source.installed(INSTALLED) if INSTALLED else Source.wheel(_download_wheel())


def fields(cls: ast.ClassDef) -> set[str]:
    """Annotated class-body names: dataclass, msgspec.Struct and ServerArgs-namespace fields."""
    return {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def assert_callable_with(fn: ast.FunctionDef | ast.AsyncFunctionDef, *names: str) -> None:
    """``fn(*names)`` binds (after ``self`` unless a staticmethod): the leading parameters are
    ``names`` and the rest have defaults."""
    args = fn.args
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    positional = [a.arg for a in args.posonlyargs + args.args][0 if static else 1 :]
    assert positional[: len(names)] == list(names), f"{fn.name}{tuple(positional)}"
    required = len(positional) - len(args.defaults)
    assert required <= len(names), f"{fn.name} needs {positional[:required]}"
    kw_required = [
        a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None
    ]
    assert not kw_required, f"{fn.name} needs keyword-only {kw_required}"


# ── the entry point and server args ──────────────────────────────────────────────────────────


@reads_sglang
def test_engine_class(src: Source) -> None:
    init = src.tree("sglang/__init__.py")
    exported = {t.id for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}  # fmt: skip
    exported |= {a.asname or a.name for n in ast.walk(init) if isinstance(n, ast.ImportFrom)
                 for a in n.names}  # fmt: skip
    assert "Engine" in exported

    engine = src.cls("sglang/srt/entrypoints/engine.py", "Engine")
    engine_methods = methods(engine)
    init_fn = engine_methods["__init__"]
    assert init_fn.args.kwarg is not None, "sglang.Engine(**server_args) is gone"
    assigned = {
        t.attr
        for n in ast.walk(init_fn)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    assert {"tokenizer_manager", "server_args"} <= assigned
    assert_callable_with(engine_methods["shutdown"])


def server_args_fields(src: Source) -> set[str]:
    """ServerArgs' own annotations plus those of the namespaces it collects."""
    server_args_py = "sglang/srt/server_args.py"
    names = fields(src.cls(server_args_py, "ServerArgs"))
    namespaces: set[str] = set()
    for node in src.tree(server_args_py).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets
        ):
            namespaces = {e.id for e in node.value.elts if isinstance(e, ast.Name)}
    for path in src.files_under("sglang/srt/arg_groups/fields/"):
        for node in src.tree(path).body:
            if isinstance(node, ast.ClassDef) and node.name in namespaces:
                names |= fields(node)
    return names


@reads_sglang
def test_server_args_we_pass_and_read(src: Source) -> None:
    passed = server_kwargs("m", dtype="bfloat16", mem_fraction_static=0.5, seed=1, version=0,
                           extra={"disable_overlap_schedule": True})  # fmt: skip
    read = {"tp_size", "sampling_mask_max_tokens"}  # engine.server_args.<name>
    missing = (passed.keys() | read) - server_args_fields(src)
    assert not missing, f"not ServerArgs fields in {src.label}: {sorted(missing)}"


# ── requests ─────────────────────────────────────────────────────────────────────────────────

IO_STRUCT = "sglang/srt/managers/io_struct.py"


@reads_sglang
@pytest.mark.parametrize(
    "params",
    [SamplingParams(), SamplingParams(temperature=0.7, top_k=20, top_p=0.9, stop_token_ids=(2,))],
)
def test_generate_request_fields(src: Source, params: SamplingParams) -> None:
    request = generate_request_kwargs([1, 2, 3], params)
    assert request.keys() <= fields(src.cls(IO_STRUCT, "GenerateReqInput"))
    sampling = src.cls("sglang/srt/sampling/sampling_params.py", "SamplingParams")
    assert request["sampling_params"].keys() <= fields(sampling)
    if request["sampling_logprobs_mode"] is not None:
        literal = src.text("sglang/srt/managers/schedule_batch.py")
        assert 'SamplingLogprobsMode = Literal["selected", "support"]' in literal


@reads_sglang
def test_weight_update_requests(src: Source) -> None:
    update = update_request_kwargs([b"payload"], version=3)
    assert update.keys() <= fields(src.cls(IO_STRUCT, "UpdateWeightsFromTensorReqInput"))

    pause = src.cls(IO_STRUCT, "PauseGenerationReqInput")
    (mode,) = [n for n in pause.body if isinstance(n, ast.AnnAssign) and n.target.id == "mode"]
    literals = {c.value for c in ast.walk(mode.annotation) if isinstance(c, ast.Constant)}
    assert "in_place" in literals
    assert "torch_empty_cache" in fields(src.cls(IO_STRUCT, "ContinueGenerationReqInput"))
    for name in ("BeginWeightUpdateReqInput", "EndWeightUpdateReqInput"):
        no_default = [n.target.id for n in src.cls(IO_STRUCT, name).body
                      if isinstance(n, ast.AnnAssign) and n.value is None]  # fmt: skip
        assert not no_default, f"{name}() needs {no_default}"


@reads_sglang
def test_tokenizer_manager_coroutines(src: Source) -> None:
    classes: dict[str, ast.ClassDef] = {}
    for path in src.files_under("sglang/srt/managers/"):
        for node in src.tree(path).body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)

    def lookup(cls_name: str, method: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        cls = classes.get(cls_name)
        if cls is None:
            return None
        if method in methods(cls):
            return methods(cls)[method]
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            if (found := lookup(name, method)) is not None:
                return found
        return None

    for method in (
        "generate_request", "pause_generation", "continue_generation",
        "begin_weight_update", "update_weights_from_tensor", "end_weight_update",
    ):  # fmt: skip
        fn = lookup("TokenizerManager", method)
        assert fn is not None, f"TokenizerManager.{method} is gone"
        assert isinstance(fn, ast.AsyncFunctionDef), f"TokenizerManager.{method} is not async"
        assert_callable_with(fn, "obj")


@reads_sglang
def test_serializer(src: Source) -> None:
    common = src.cls("sglang/srt/utils/common.py", "MultiprocessingSerializer")
    assert_callable_with(methods(common)["serialize"], "obj")
    utils_init = src.text("sglang/srt/utils/__init__.py")
    assert "from sglang.srt.utils.common import *" in utils_init
    assert "__all__" not in src.text("sglang/srt/utils/common.py")


# ── outputs and their meaning ────────────────────────────────────────────────────────────────


@reads_sglang
def test_meta_info_keys(src: Source) -> None:
    manager = src.text("sglang/srt/managers/tokenizer_manager.py")
    for key in ("output_token_logprobs", "output_token_sampling_logprobs", "finish_reason"):
        assert f'meta_info["{key}"]' in manager or f'"{key}":' in manager, key
    spans = src.text("sglang/srt/utils/weight_versions.py")
    assert 'meta_info["weight_versions"]' in spans
    assert all(f'"{k}": ' in spans for k in ("version", "start", "end"))
    reasons = src.text("sglang/srt/managers/schedule_batch.py")
    assert all(f'"type": "{k}"' in reasons for k in ("stop", "length", "abort"))


@reads_sglang
def test_logprob_semantics_canary(src: Source) -> None:
    """The lines the module docstring's logprob claims rest on; if one moves, re-read them."""
    sampler = src.text("sglang/srt/layers/sampler.py")
    assert "logits.div_(sampling_info.temperatures)" in sampler  # T applied before softmax
    assert "else torch.log(probs)" in sampler  # plain logprobs: pre-truncation log p_T
    assert "torch.log(selected_weight / support_mass)" in sampler  # mask: renormalised
    assert 'get_bool_env_var("SGLANG_RETURN_ORIGINAL_LOGPROB")' in sampler
    scheduler = src.text("sglang/srt/managers/scheduler.py")
    assert "top_k != 1 and not (1 < top_k <= sampling_mask_cap)" in scheduler


# ── the pure helpers ─────────────────────────────────────────────────────────────────────────


def test_import_does_not_import_sglang() -> None:
    code = (
        "import sys, streamrl.workers.engines.sglang_engine\n"
        "assert 'sglang' not in sys.modules, 'sglang_engine imported sglang'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_server_kwargs_reserved() -> None:
    kwargs = server_kwargs("m", dtype="float16", mem_fraction_static=0.5, seed=7, version=2,
                           extra={"tp_size": 1})  # fmt: skip
    assert kwargs["skip_tokenizer_init"] is True
    assert kwargs["weight_version"] == "2" and kwargs["random_seed"] == 7
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        server_kwargs("m", dtype="float16", mem_fraction_static=0.5, seed=7, version=0,
                      extra={"skip_tokenizer_init": False})  # fmt: skip


def test_sampling_params_mapping() -> None:
    assert sglang_sampling_params(SamplingParams(max_new_tokens=5)) == {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 5,
        "stop_token_ids": None, "min_p": 0.0, "repetition_penalty": 1.0,
        "frequency_penalty": 0.0, "presence_penalty": 0.0,
    }  # fmt: skip
    mapped = sglang_sampling_params(SamplingParams(top_k=4, stop_token_ids=(2, 7)))
    assert mapped["top_k"] == 4 and mapped["stop_token_ids"] == [2, 7]


def test_sampling_mask_choice_and_limits() -> None:
    assert not uses_sampling_mask(SamplingParams(temperature=0.7))
    for params in (
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=8),
        SamplingParams(top_k=8, top_p=0.9),
    ):
        assert uses_sampling_mask(params)
        check_sampling(params, mask_max_tokens=4096)
    masked = generate_request_kwargs([5], SamplingParams(top_k=8))
    assert masked["return_sampling_mask"] and masked["sampling_logprobs_mode"] == "selected"
    assert not masked["return_logprob"]
    plain = generate_request_kwargs([5], SamplingParams())
    assert plain["return_logprob"] and plain["sampling_logprobs_mode"] is None
    check_sampling(SamplingParams(temperature=0.0, top_p=0.5), mask_max_tokens=4096)
    with pytest.raises(ValueError, match="top_k"):
        check_sampling(SamplingParams(top_p=0.9), mask_max_tokens=4096)
    with pytest.raises(ValueError, match="top_k"):
        check_sampling(SamplingParams(top_k=5000), mask_max_tokens=4096)


def test_finish_reason() -> None:
    assert finish_reason({"type": "stop", "matched": 2}) == "stop"
    assert finish_reason({"type": "length", "length": 8}) == "length"
    assert finish_reason({"type": "abort", "message": "x"}) == "abort"
    assert finish_reason(None) == "abort"


def test_token_versions() -> None:
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]
    assert token_versions(spans) == [3, 3, 4, 4, 4]
    assert token_versions([{"version": "0", "start": 0, "end": 0}]) == []
    with pytest.raises(ValueError, match="contiguous"):
        token_versions([{"version": "3", "start": 1, "end": 2}])


def _meta(**extra: object) -> dict:
    return {
        "finish_reason": {"type": "length", "length": 3},
        "weight_versions": [
            {"version": "0", "start": 0, "end": 1},
            {"version": "1", "start": 1, "end": 3},
        ],
        **extra,
    }


def test_output_plain_logprobs() -> None:
    meta = _meta(output_token_logprobs=[(-0.5, 11, None), (-1.0, 12, None), (-2.0, 13, None)])
    out = output_from_sglang({"output_ids": [11, 12, 13], "meta_info": meta}, sampling_mask=False)
    assert out.response_ids == [11, 12, 13]
    assert out.logprobs == [-0.5, -1.0, -2.0]
    assert out.token_versions == [0, 1, 1]
    assert out.finish_reason == "length"
    bad = _meta(output_token_logprobs=[(-0.5, 99, None), (-1.0, 12, None), (-2.0, 13, None)])
    with pytest.raises(ValueError, match="output_ids"):
        output_from_sglang({"output_ids": [11, 12, 13], "meta_info": bad}, sampling_mask=False)


def test_output_sampling_mask_logprobs() -> None:
    meta = _meta(output_token_sampling_logprobs=[0.0, -0.1, -0.2],
                 output_token_logprobs=[(-9.0, 11, None)] * 3)  # fmt: skip
    out = output_from_sglang({"output_ids": [11, 12, 13], "meta_info": meta}, sampling_mask=True)
    assert out.logprobs == [0.0, -0.1, -0.2]


def test_output_length_mismatch() -> None:
    meta = _meta(output_token_sampling_logprobs=[0.0, -0.1])
    with pytest.raises(ValueError, match="3 tokens, 2 logprobs"):
        output_from_sglang({"output_ids": [11, 12, 13], "meta_info": meta}, sampling_mask=True)
    meta["finish_reason"] = {"type": "abort", "message": "aborted"}
    out = output_from_sglang({"output_ids": [11, 12, 13], "meta_info": meta}, sampling_mask=True)
    assert out.finish_reason == "abort" and out.response_ids == [11, 12]
    assert out.token_versions == [0, 1]


# ── the engine's choreography, against a fake SGLang ─────────────────────────────────────────


class FakeTokenizerManager:
    """Decodes one token per ~2 ms and records weight-version changes per live request the way
    SGLang's scheduler does (``record_weight_version_events``)."""

    def __init__(self) -> None:
        self.calls: list[object] = []
        self.version = "0"
        self.paused = False
        self.live: list[dict] = []

    async def generate_request(self, obj: SimpleNamespace):  # an async generator, like SGLang's
        req: dict = {"ids": [], "events": []}
        self.live.append(req)
        for _ in range(obj.sampling_params["max_new_tokens"]):
            await asyncio.sleep(0.002)
            while self.paused:
                await asyncio.sleep(0.001)
            req["ids"].append(7)
        self.live.remove(req)
        spans, start = [], 0
        for version, end in [*req["events"], (self.version, len(req["ids"]))]:
            if end > start:
                spans.append({"version": version, "start": start, "end": end})
                start = end
        n = len(req["ids"])
        meta = {
            "finish_reason": {"type": "length", "length": n},
            "output_token_logprobs": [(-1.0, 7, None)] * n,
            "weight_versions": spans,
        }
        yield {"output_ids": req["ids"], "meta_info": meta}

    async def pause_generation(self, obj: SimpleNamespace) -> None:
        self.calls.append(("pause", obj.mode))
        self.paused = True

    async def begin_weight_update(self, obj: SimpleNamespace) -> tuple[bool, str]:
        self.calls.append("begin")
        return True, "ok"

    async def update_weights_from_tensor(self, obj: SimpleNamespace) -> tuple[bool, str]:
        self.calls.append(("update", obj.weight_version, obj.flush_cache))
        for req in self.live:
            req["events"].append((self.version, len(req["ids"])))
        self.version = obj.weight_version
        return True, "ok"

    async def end_weight_update(self, obj: SimpleNamespace) -> tuple[bool, str]:
        self.calls.append("end")
        return True, "ok"

    async def continue_generation(self, obj: SimpleNamespace) -> None:
        self.calls.append(("continue", obj.torch_empty_cache))
        self.paused = False


@pytest.fixture
def fake_sglang(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    state = SimpleNamespace(kwargs=None, manager=FakeTokenizerManager(), shut_down=False)

    class FakeEngine:
        def __init__(self, **kwargs: object) -> None:
            state.kwargs = kwargs
            self.tokenizer_manager = state.manager
            self.server_args = SimpleNamespace(tp_size=1, sampling_mask_max_tokens=4096)

        def shutdown(self) -> None:
            state.shut_down = True

    io_struct = types.ModuleType("sglang.srt.managers.io_struct")
    for name in (
        "GenerateReqInput", "UpdateWeightsFromTensorReqInput", "PauseGenerationReqInput",
        "ContinueGenerationReqInput", "BeginWeightUpdateReqInput", "EndWeightUpdateReqInput",
    ):  # fmt: skip
        setattr(io_struct, name, type(name, (SimpleNamespace,), {}))
    modules = {name: types.ModuleType(name) for name in
               ("sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.utils")}  # fmt: skip
    modules["sglang"].Engine = FakeEngine
    modules["sglang.srt.managers"].io_struct = io_struct
    modules["sglang.srt.managers.io_struct"] = io_struct
    modules["sglang.srt.utils"].MultiprocessingSerializer = SimpleNamespace(
        serialize=lambda obj: b"tensors"
    )
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    return state


def test_in_flight_update_choreography(fake_sglang: SimpleNamespace) -> None:
    engine = SGLangEngine("some/model", seed=3)
    assert fake_sglang.kwargs["skip_tokenizer_init"] is True
    assert fake_sglang.kwargs["weight_version"] == "0"
    steps: list[int] = []

    def on_step(eng: Engine) -> None:
        steps.append(eng.version)
        if len(steps) == 2:  # ~40 ms into a >=200 ms generation
            eng.update_weights([("w", torch.zeros(2))], version=1)

    try:
        outs = engine.generate([[1, 2]] * 3, SamplingParams(max_new_tokens=100), on_step)
        assert fake_sglang.manager.calls == [
            ("pause", "in_place"), "begin", ("update", "1", False), "end", ("continue", False),
        ]  # fmt: skip
        assert engine.version == 1 and steps[:2] == [0, 0] and steps[2:3] == [1]
        for out in outs:
            assert len(out.response_ids) == len(out.token_versions) == 100
            assert out.token_versions == sorted(out.token_versions)
            assert set(out.token_versions) == {0, 1}
        (after,) = engine.generate([[1]], SamplingParams(max_new_tokens=3))
        assert after.token_versions == [1, 1, 1]
    finally:
        engine.shutdown()
    assert fake_sglang.shut_down
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate([[1]], SamplingParams())


def test_failing_hook_cancels_generation(fake_sglang: SimpleNamespace) -> None:
    engine = SGLangEngine("some/model")

    def on_step(eng: Engine) -> None:
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            engine.generate([[1]] * 2, SamplingParams(max_new_tokens=1000), on_step)
        (out,) = engine.generate([[1]], SamplingParams(max_new_tokens=2))  # still usable
        assert out.response_ids == [7, 7]
    finally:
        engine.shutdown()


def test_refuses_original_logprobs(
    fake_sglang: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "true")
    with pytest.raises(RuntimeError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        SGLangEngine("some/model")


def test_missing_sglang_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sglang", None)  # as if not installed
    with pytest.raises(RuntimeError, match=r"pip install 'streamrl\[sglang\]'"):
        SGLangEngine("some/model")


def test_the_sglang_extra_pins_the_checked_version() -> None:
    import tomllib
    from pathlib import Path

    from streamrl.workers.engines.sglang_engine import SGLANG_VERSION

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["sglang"] == [f"sglang=={SGLANG_VERSION}"]
