"""No pickle, eval or exec on any input path (issue 13; docs/design.md §5).

Every module of the package (``streamrl/`` and the directories pyproject maps into it:
``buffers/`` as ``streamrl.buffers``, ``workers/`` as ``streamrl.workers``) is parsed with
``ast`` and refused if it imports a module that unpickles (``pickle``, ``cPickle``, ``dill``,
``marshal``, ``shelve``, ``cloudpickle``, ``joblib``), calls ``eval``/``exec``/``compile``,
``torch.load`` without ``weights_only=True``, ``yaml.load`` without a safe loader (or
``yaml.unsafe_load``/``full_load``), ``numpy.load`` with ``allow_pickle`` other than
``False``, or ``pandas.read_pickle``. Imports are followed through aliases (``import torch as
t``, ``from torch import load``).

``torch.distributed.checkpoint.load`` reads pickled metadata (DCP's ``.metadata`` file); it
is allowed only where listed in ``ALLOWED`` with the reason: it reads the run's own
checkpoint directory, never a peer's bytes. So is ``cloudpickle`` in ``streamrl.callables``:
the Python API's reward functions and environment classes, pickled in the process that called
``streamrl.train`` from its caller's own objects, reach the generators inside their spec,
as Ray delivers any actor's arguments; no socket or file of the run carries them.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BANNED_MODULES = {"pickle", "cPickle", "_pickle", "dill", "marshal", "shelve", "cloudpickle"}
BANNED_MODULES |= {"joblib"}
BANNED_BUILTINS = {"eval", "exec", "compile"}
BANNED_CALLS = {
    "yaml.unsafe_load": "unpickles arbitrary Python objects",
    "yaml.unsafe_load_all": "unpickles arbitrary Python objects",
    "yaml.full_load": "constructs arbitrary Python objects",
    "yaml.full_load_all": "constructs arbitrary Python objects",
    "pandas.read_pickle": "unpickles",
    "torch.distributed.checkpoint.load": "unpickles the checkpoint's metadata",
    "torch.distributed.checkpoint.state_dict_loader.load": "unpickles the checkpoint's metadata",
}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}

# (file relative to the repository, dotted call) -> why it is not on an input path.
ALLOWED = {
    ("workers/learning/checkpoint.py", "torch.distributed.checkpoint.load"): (
        "loads the run's own checkpoint directory (resume), written by this run's learners"
    ),
    ("streamrl/export.py", "torch.distributed.checkpoint.load"): (
        "exports a checkpoint directory the operator names on the command line"
    ),
    # An import (``imports X``) is listed by the module imported.
    ("streamrl/callables.py", "cloudpickle"): (
        "loads the callables streamrl.train pickled from its caller's objects, sent in the "
        "generators' specs (Ray actor arguments), never read from a socket or a file"
    ),
}


def package_dirs() -> list[Path]:
    """``streamrl/`` and every directory pyproject's ``package-dir`` maps into the package."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapped = pyproject["tool"]["setuptools"]["package-dir"].values()
    dirs = {(ROOT / d).resolve() for d in mapped} | {(ROOT / "streamrl").resolve()}
    return sorted(dirs)


def package_files() -> list[Path]:
    files: set[Path] = set()
    for d in package_dirs():
        files |= {p.resolve() for p in d.rglob("*.py")}  # resolved: a symlink counts once
    return sorted(files)


class Checker(ast.NodeVisitor):
    """Findings ``(line, what)`` for one module's source."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted module or object
        self.findings: list[tuple[int, str]] = []

    # -------------------------------------------------------------- imports

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            local = alias.asname or alias.name.split(".")[0]
            self.aliases[local] = alias.name if alias.asname else local

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0:
            self._check_module(node, module)
        for alias in node.names:
            dotted = f"{module}.{alias.name}" if module else alias.name
            if node.level == 0:
                self._check_module(node, dotted)
            self.aliases[alias.asname or alias.name] = dotted

    def _check_module(self, node: ast.AST, dotted: str) -> None:
        if dotted.split(".")[0] in BANNED_MODULES:
            self.findings.append((node.lineno, f"imports {dotted}"))

    # -------------------------------------------------------------- calls

    def dotted(self, node: ast.expr) -> str | None:
        """``torch.load`` for ``t.load`` after ``import torch as t``; None if not a name."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def visit_Call(self, node: ast.Call) -> None:
        name = self.dotted(node.func)
        if name is not None:
            self._check_call(node, name)
        self.generic_visit(node)

    def _check_call(self, node: ast.Call, name: str) -> None:
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if isinstance(node.func, ast.Name) and node.func.id in BANNED_BUILTINS:
            self.findings.append((node.lineno, f"calls {node.func.id}()"))
        elif name in {f"builtins.{b}" for b in BANNED_BUILTINS}:
            self.findings.append((node.lineno, f"calls {name}()"))
        elif name in BANNED_CALLS:
            self.findings.append((node.lineno, f"calls {name} ({BANNED_CALLS[name]})"))
        elif name == "torch.load":
            if not _is_constant(keywords.get("weights_only"), True):
                self.findings.append((node.lineno, "calls torch.load without weights_only=True"))
        elif name in {"yaml.load", "yaml.load_all"}:
            loader = keywords.get("Loader", node.args[1] if len(node.args) > 1 else None)
            loader_name = self.dotted(loader) if loader is not None else None
            if loader_name is None or loader_name.split(".")[-1] not in SAFE_YAML_LOADERS:
                self.findings.append((node.lineno, f"calls {name} without a safe Loader"))
        elif name in {"numpy.load", "numpy.lib.npyio.load"}:
            allow = keywords.get("allow_pickle")
            if allow is not None and not _is_constant(allow, False):
                self.findings.append((node.lineno, "calls numpy.load with allow_pickle"))


def _is_constant(node: ast.expr | None, value: bool) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def findings_in(source: str) -> list[tuple[int, str]]:
    checker = Checker()
    checker.visit(ast.parse(source))
    return checker.findings


def test_the_package_is_all_checked() -> None:
    """The scan covers the real source files: the mapped directories and the modules that
    parse input (a vacuous pass would prove nothing)."""
    files = {p.relative_to(ROOT).as_posix() for p in package_files()}
    for must in (
        "streamrl/transport.py",
        "streamrl/protocol/trajectories.py",
        "streamrl/controller/admission.py",
        "streamrl/controller/run.py",
        "streamrl/admin/api.py",
        "streamrl/admin/server.py",
        "buffers/server.py",
        "buffers/frames.py",
        "buffers/durable_log.py",
        "workers/learning/publisher.py",
        "workers/generation/subscriber.py",
        "workers/generation/generator.py",
        "workers/learning/checkpoint.py",
    ):
        assert must in files, must
    assert len(files) > 50


def test_no_unsafe_deserialization_in_the_package() -> None:
    problems, used = [], set()
    for path in package_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, what in findings_in(path.read_text()):
            call = what.removeprefix("calls ").removeprefix("imports ").split(" ")[0]
            if (rel, call) in ALLOWED:
                used.add((rel, call))
                continue
            problems.append(f"{rel}:{line}: {what}")
    assert not problems, "unsafe deserialization on a possible input path:\n" + "\n".join(problems)
    assert used == set(ALLOWED), f"stale ALLOWED entries: {set(ALLOWED) - used}"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import pickle", "imports pickle"),
        ("import cPickle as p", "imports cPickle"),
        ("from dill import loads", "imports dill"),
        ("import marshal, os", "imports marshal"),
        ("from shelve import open", "imports shelve"),
        ("from multiprocessing import reduction\nimport _pickle", "imports _pickle"),
        ("eval('1')", "calls eval()"),
        ("exec(code)", "calls exec()"),
        ("import builtins\nbuiltins.eval(x)", "calls builtins.eval()"),
        ("import torch\ntorch.load(f)", "calls torch.load without weights_only=True"),
        ("import torch as t\nt.load(f, weights_only=False)", "calls torch.load without"),
        ("from torch import load\nload(f)", "calls torch.load without"),
        ("import yaml\nyaml.load(s)", "calls yaml.load without a safe Loader"),
        ("import yaml\nyaml.load(s, Loader=yaml.FullLoader)", "calls yaml.load without"),
        ("import yaml\nyaml.load(s, yaml.Loader)", "calls yaml.load without"),
        ("import yaml\nyaml.unsafe_load(s)", "calls yaml.unsafe_load"),
        ("import numpy as np\nnp.load(f, allow_pickle=True)", "calls numpy.load with"),
        ("import numpy as np\nnp.load(f, allow_pickle=flag)", "calls numpy.load with"),
        ("import pandas as pd\npd.read_pickle(f)", "calls pandas.read_pickle"),
        (
            "import torch.distributed.checkpoint as dcp\ndcp.load(s, checkpoint_id=p)",
            "calls torch.distributed.checkpoint.load",
        ),
    ],
)
def test_the_checker_catches(source: str, expected: str) -> None:
    found = findings_in(source)
    assert any(what.startswith(expected) for _, what in found), found
    assert all(line >= 1 for line, _ in found)


@pytest.mark.parametrize(
    "source",
    [
        "model.eval()",
        "import torch\ntorch.load(f, weights_only=True)",
        "import yaml\nyaml.safe_load(s)",
        "import yaml\nyaml.load(s, Loader=yaml.SafeLoader)",
        "import yaml\nyaml.load(s, yaml.CSafeLoader)",
        "import numpy as np\nnp.load(f)",
        "import numpy as np\nnp.load(f, allow_pickle=False)",
        "import json\njson.loads(s)",
        "import msgspec\nmsgspec.msgpack.decode(b)",
        "from safetensors.torch import load_file\nload_file(p)",
        "def evaluate(x):\n    return x\nevaluate(1)",
    ],
)
def test_the_checker_passes_safe_code(source: str) -> None:
    assert findings_in(source) == []
