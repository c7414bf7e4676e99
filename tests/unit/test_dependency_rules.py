"""The dependency rules of docs/design.md §2, checked on the source, and its section references.

Every ``.py`` file under ``streamrl/``, ``workers/`` and ``buffers/`` is parsed (``ast``, no
import) and every import statement in it is read: module level, inside functions and
methods, under ``try``. Only imports under ``if TYPE_CHECKING:`` are left out: they never
run. Module names follow ``pyproject.toml``'s ``package-dir`` (``workers/`` is
``streamrl.workers``, ``buffers/`` is ``streamrl.buffers``); ``import workers.x`` and relative
imports are resolved to the same names. The rules (the same words are in §2):

1. ``streamrl.config`` and ``streamrl.protocol`` are leaves: they import no torch and no zmq,
   and of streamrl only modules that themselves import no torch, no zmq and no streamrl
   module (stdlib helpers such as ``streamrl.config.key_rules``).
2. ``buffers`` never imports torch, directly or through any streamrl module it imports
   (followed transitively, function-local imports and packages' ``__init__`` included).
   Neither do ``streamrl.files``, ``streamrl.checkpoint_layout`` and ``streamrl.cores``, which
   import no zmq and no Ray either.
3. Only the controller (``streamrl.controller``) and the CLI (``streamrl.cli``) import workers
   and buffers. Between the two, workers may import buffers (the generator's ``Outbox``, the
   learner's ``BufferClient``); buffers never import workers.
4. Workers and buffers never import what sits above them: ``streamrl.controller``,
   ``streamrl.admin``, ``streamrl.bench``, ``streamrl.cli``.
5. No two streamrl modules import each other, directly or around a longer cycle.
6. What the TRL peer (``benchmarks/trl_peer.py``, in the light ``.venv-trl`` that
   ``scripts/trl_venv.sh`` makes) imports, the default job's rewards, and ``streamrl validate``
   need none of streamrl's dependencies that venv lacks (Ray, ZeroMQ, cloudpickle, wandb, ...;
   ``validate`` not even torch): run in a fresh interpreter that refuses to import them.

And every ``docs/design.md §<number>`` cited under ``streamrl/``, ``workers/``, ``buffers/``,
``tests/``, ``docs/``, ``benchmarks/``, ``configs/``, ``scripts/`` and in ``README.md`` (also
spelled ``DESIGN §…``; in design.md itself a bare ``§…``) names a ``## <number>.`` heading of
design.md.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("streamrl", "workers", "buffers")
LEAVES = ("streamrl.config", "streamrl.protocol")
TORCH_FREE = ("streamrl.buffers", "streamrl.files", "streamrl.checkpoint_layout", "streamrl.cores")
LIGHT = ("streamrl.files", "streamrl.checkpoint_layout", "streamrl.cores")  # rule 2, 2nd half
MAY_IMPORT_WORKERS_AND_BUFFERS = ("streamrl.controller", "streamrl.cli")
ABOVE_WORKERS_AND_BUFFERS = (
    "streamrl.controller",
    "streamrl.admin",
    "streamrl.bench",
    "streamrl.cli",
)


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    target: str  # dotted name imported (a streamrl module where it names one)
    where: str  # file:line

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.target}"


def within(name: str, *prefixes: str) -> bool:
    """``name`` is one of ``prefixes`` or inside one of them (a submodule)."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@cache
def modules() -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package's ``__init__``), as ``package-dir`` maps them."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir = pyproject["tool"]["setuptools"]["package-dir"]
    homes = {(ROOT / d).resolve(): name for name, d in package_dir.items()}
    found = {}
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            directory, inner = path.parent.resolve(), []
            while directory not in homes:
                inner.insert(0, directory.name)
                directory = directory.parent
            parts = [homes[directory], *inner]
            if path.stem != "__init__":
                parts.append(path.stem)
            found[".".join(parts)] = (path, path.stem == "__init__")
    return found


def _canonical(name: str) -> str:
    """``workers.x`` / ``buffers.x`` (the source directories' own names) -> ``streamrl.…``."""
    head = name.split(".", 1)[0]
    return f"streamrl.{name}" if head in ("workers", "buffers") else name


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``node``, at any depth, but for ``if TYPE_CHECKING:`` bodies."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    elif isinstance(node, ast.If) and _is_type_checking(node.test):
        for statement in node.orelse:
            yield from _import_nodes(statement)
    else:
        for child in ast.iter_child_nodes(node):
            yield from _import_nodes(child)


@cache
def imports_of(name: str) -> tuple[Import, ...]:
    path, is_package = modules()[name]
    rel = path.relative_to(ROOT)
    found = []
    for node in _import_nodes(ast.parse(path.read_text(), str(rel))):
        where = f"{rel}:{node.lineno}"
        if isinstance(node, ast.Import):
            found += [Import(name, _canonical(a.name), where) for a in node.names]
            continue
        if node.module == "__future__":
            continue
        if node.level:  # relative: from the importer's package, up level - 1
            package = (name if is_package else name.rpartition(".")[0]).split(".")
            base = ".".join(package[: len(package) - node.level + 1])
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = _canonical(node.module or "")
        for alias in node.names:  # ``from a import b``: a.b where b is a module, else a
            sub = f"{base}.{alias.name}"
            found.append(Import(name, sub if sub in modules() else base, where))
    return tuple(found)


def owner(target: str) -> str | None:
    """The streamrl module that ``target`` (a module or a name in one) lives in, if any."""
    while target and target not in modules():
        target = target.rpartition(".")[0]
    return target or None


def runs_first(module: str) -> list[str]:
    """``module`` and the packages whose ``__init__`` Python runs before it."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def reach(start: str) -> dict[str, Import | None]:
    """Every streamrl module importing ``start`` executes, with the import that first
    reached it (None for ``start`` itself); breadth first, so each chain is a shortest one."""
    seen: dict[str, Import | None] = {start: None}
    todo = deque([start])
    while todo:
        for imp in imports_of(todo.popleft()):
            for module in runs_first(owner(imp.target) or ""):
                if module in modules() and module not in seen:
                    seen[module] = imp
                    todo.append(module)
    return seen


def chain(seen: dict[str, Import | None], module: str) -> str:
    """How ``module`` was reached: one ``file:line`` per hop."""
    hops = []
    while (imp := seen[module]) is not None:
        hops.append(str(imp))
        module = imp.importer
    return "; ".join(reversed(hops))


def third_party(target: str, *names: str) -> bool:
    return target.split(".", 1)[0] in names


def test_the_package_map_is_read() -> None:
    """The rules below see every module under its importable name."""
    names = modules()
    assert {
        "streamrl.config",
        "streamrl.workers.generation.generator",
        "streamrl.buffers.server",
    } <= set(names)
    assert "streamrl.workers.engines.hf" in names
    assert not any(n.startswith(("workers", "buffers")) for n in names)


def test_resolves_every_spelling() -> None:
    """Relative imports, ``workers.x`` and ``from pkg import module`` name the module."""
    assert _canonical("buffers.delivery") == "streamrl.buffers.delivery"
    targets = {i.target for i in imports_of("streamrl.buffers.server")}
    assert "streamrl.buffers.durable_log" in targets  # ``from .durable_log import DurableLog``
    targets = {i.target for i in imports_of("streamrl.workers.learning.learner")}
    # ``from streamrl.workers.learning import checkpoint``
    assert "streamrl.workers.learning.checkpoint" in targets
    local = {i.target for i in imports_of("streamrl.workers.generation.generator_evaluations")}
    assert "streamrl.workers.generation.evaluator" in local  # a function-local import
    assert "torch" not in {i.target for i in imports_of("streamrl.algorithms")}  # TYPE_CHECKING


def test_config_and_protocol_are_leaves() -> None:
    problems = []
    parts = [m for m in modules() if within(m, *LEAVES)]  # a leaf package's modules too
    assert "streamrl.config.loading" in parts
    for module in parts:
        leaf = next(leaf for leaf in LEAVES if within(module, leaf))
        for imp in imports_of(module):
            if third_party(imp.target, "torch", "zmq"):
                problems.append(f"{imp}: a leaf imports no torch and no zmq")
            elif within(imp.target, leaf):
                continue  # a leaf package's modules import each other
            elif within(imp.target, "streamrl"):
                helper = owner(imp.target) or "streamrl"
                deeper = [
                    str(i)
                    for i in imports_of(helper)
                    if third_party(i.target, "torch", "zmq") or within(i.target, "streamrl")
                ]
                if deeper:
                    problems.append(
                        f"{imp}: a leaf imports only streamrl modules that import no torch, no "
                        f"zmq and no streamrl module, and {helper} does: {'; '.join(deeper)}"
                    )
    assert not problems, "\n".join(problems)


def test_torch_free_modules_never_reach_torch() -> None:
    problems: dict[str, str] = {}  # each offending import once, with one way it is reached
    for start in sorted(m for m in modules() if within(m, *TORCH_FREE)):
        heavy = ("torch", "zmq", "ray") if within(start, *LIGHT) else ("torch",)
        seen = reach(start)
        for module in seen:
            for imp in imports_of(module):
                if third_party(imp.target, *heavy) and str(imp) not in problems:
                    how = chain(seen, module)
                    problems[str(imp)] = f"{start} imports it" + (f" by {how}" if how else "")
    shown = [f"{imp}\n    ({why})" for imp, why in list(problems.items())[:10]]
    more = [f"... and {len(problems) - 10} more"] if len(problems) > 10 else []
    assert not problems, "imports that design §2 forbids here:\n" + "\n".join(shown + more)


def test_only_the_controller_and_the_cli_import_workers_and_buffers() -> None:
    problems = []
    for name in modules():
        for imp in imports_of(name):
            if within(name, "streamrl.workers", "streamrl.buffers"):
                if within(name, "streamrl.buffers") and within(imp.target, "streamrl.workers"):
                    problems.append(f"{imp} (buffers never import workers)")
            elif within(imp.target, "streamrl.workers", "streamrl.buffers") and not within(
                name, *MAY_IMPORT_WORKERS_AND_BUFFERS
            ):
                problems.append(f"{imp} (only the controller and the CLI import them)")
    assert not problems, "\n".join(problems)


def test_workers_and_buffers_never_import_the_layers_above() -> None:
    problems = [
        f"{imp} (workers and buffers sit below {', '.join(ABOVE_WORKERS_AND_BUFFERS)})"
        for name in modules()
        if within(name, "streamrl.workers", "streamrl.buffers")
        for imp in imports_of(name)
        if within(imp.target, *ABOVE_WORKERS_AND_BUFFERS)
    ]
    assert not problems, "\n".join(problems)


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over module -> imported module."""
    edges = {
        name: {
            (owner(imp.target), imp)
            for imp in imports_of(name)
            if owner(imp.target) not in (None, name)
        }
        for name in modules()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w, _ in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append([v, *component])

    for name in modules():
        if name not in index:
            visit(name)
    described = [
        "; ".join(str(imp) for m in cycle for w, imp in edges[m] if w in cycle) for cycle in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(described)


# ----------------------------------------------------------------- light imports (rule 6)

TRL_PEER = ROOT / "benchmarks" / "trl_peer.py"
TRL_VENV = ROOT / "scripts" / "trl_venv.sh"
# What .venv-trl holds of streamrl's dependencies: what scripts/trl_venv.sh installs (torch,
# msgspec, pyyaml, safetensors, gguf) and what TRL brings (transformers, accelerate, datasets
# with pyarrow and xxhash, huggingface_hub). Every other dependency, extra or engine is refused.
PEER_VENV = {
    "torch", "transformers", "accelerate", "datasets", "pyarrow", "xxhash", "huggingface_hub",
    "msgspec", "yaml", "safetensors", "gguf",
}  # fmt: skip
IMPORT_NAMES = {"pyzmq": "zmq", "pyyaml": "yaml", "math-verify": "math_verify"}
ENGINES = ("vllm", "sglang")
# A fresh interpreter whose imports of the refused top-level packages fail, as in a venv
# without them (sys.argv[1]: their names, comma-separated); then the code under test.
REFUSING = """\
import sys

REFUSED = set(sys.argv[1].split(","))


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {name!r} (refused: not in the venv)")


sys.meta_path.insert(0, Refuse())
"""


def _requirement_names() -> set[str]:
    """The import names of streamrl's dependencies and optional extras (``pyproject.toml``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    specs += [s for extra in project["optional-dependencies"].values() for s in extra]
    names = {re.match(r"[A-Za-z0-9_.-]+", s).group().lower() for s in specs}
    return {IMPORT_NAMES.get(n, n.replace("-", "_")) for n in names}


def _not_in_peer_venv() -> list[str]:
    dev = {"pytest", "pytest_timeout", "ruff", "httpx", "psutil", "matplotlib"}
    return sorted((_requirement_names() | set(ENGINES)) - PEER_VENV - dev)


def _run_refusing(refused: list[str], code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", REFUSING + code, ",".join(refused)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    assert done.returncode == 0, f"refusing {refused}: {last}\n{done.stderr[-3000:]}"


def _peer_imports() -> list[tuple[str, list[str]]]:
    """(module, names) of every streamrl import in the TRL peer (function-local ones too), and
    the modules ``scripts/trl_venv.sh`` checks it can import."""
    found = []
    for node in ast.walk(ast.parse(TRL_PEER.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("streamrl"):
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("streamrl")]
    checked = re.findall(r"^import (streamrl\..*)$", TRL_VENV.read_text(), re.MULTILINE)
    found += [(m.strip(), []) for line in checked for m in line.split(",")]
    return found


def test_the_peer_venv_is_what_the_rule_refuses_around() -> None:
    """The refused packages are real: the ones issue 53 met (cloudpickle) among them, and
    none the peer venv installs; the peer's imports were read from both files."""
    refused = _not_in_peer_venv()
    assert {"cloudpickle", "ray", "zmq", "wandb", "vllm"} <= set(refused)
    assert not set(refused) & PEER_VENV
    modules = {m for m, _ in _peer_imports()}
    assert {"streamrl.rewards", "streamrl.models", "streamrl.evaluation"} <= modules


def test_the_trl_peer_and_its_rewards_import_without_what_its_venv_lacks() -> None:
    """Every streamrl name the peer imports loads, and the default job's rule rewards resolve
    and score a response, with streamrl's other dependencies refused (rule 6)."""
    code = f"""
import importlib
for module, names in {_peer_imports()!r}:
    loaded = importlib.import_module(module)
    for name in names:
        getattr(loaded, name)
from streamrl.config import default_config_path, load_config
from streamrl.rewards import CombinedReward, RewardInput, check_rewards
config = load_config(default_config_path())
check_rewards(config.rewards)
assert CombinedReward(config.rewards)(RewardInput("12 + 8 = 20", [], "20", prompt_text="12 + 8"))
"""
    _run_refusing(_not_in_peer_venv(), code)


def test_validate_runs_without_torch_or_what_the_peer_venv_lacks() -> None:
    """``streamrl validate`` of a shipped job runs with torch refused too (rule 6)."""
    code = "from streamrl.cli import main\nassert main(['validate', 'configs/tiny.yaml']) == 0\n"
    _run_refusing([*_not_in_peer_venv(), "torch"], code)


# ----------------------------------------------------------------- §N references

DESIGN = ROOT / "docs" / "design.md"
SECTION_HEADING = re.compile(r"^## (\d+[a-z]?)\. ", re.MULTILINE)
# ``docs/design.md §3``, ``design.md`` §5b (Markdown), ``DESIGN §5b``; in design.md a bare §3.
CITATION = re.compile(r"(?:design\.md`?|DESIGN)\s*§\s*(\d+[a-z]?)\b")
BARE = re.compile(r"§\s*(\d+[a-z]?)\b")
CITING_FILES = ("*.py", "*.md", "*.yaml", "*.sh", "*.toml")


def _citing_files() -> Iterator[Path]:
    for top in (*SOURCE_DIRS, "tests", "docs", "benchmarks", "configs", "scripts"):
        for pattern in CITING_FILES:
            yield from sorted((ROOT / top).rglob(pattern))
    yield ROOT / "README.md"


def test_design_sections_cited_exist() -> None:
    sections = set(SECTION_HEADING.findall(DESIGN.read_text()))
    assert {"1", "2", "3", "5b"} <= sections, sections
    dangling = []
    for path in _citing_files():
        if not path.is_file():
            continue
        pattern = BARE if path == DESIGN else CITATION
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for cited in pattern.findall(line):
                if cited not in sections:
                    dangling.append(f"{path.relative_to(ROOT)}:{number}: §{cited}")
    assert not dangling, (
        f"docs/design.md has sections {sorted(sections)}; these cite others:\n"
        + "\n".join(dangling)
    )


def _layout_section() -> str:
    text = DESIGN.read_text()
    start = text.index("## 2. Layout")
    return text[start : SECTION_HEADING.search(text, start + 1).start()]


def test_the_layout_names_every_module() -> None:
    """design.md §2 names every module of ``streamrl/``, ``workers/`` and ``buffers/`` on the
    line of its package (or a line the package's entry continues on), so a new module lands
    with its place in the map."""
    layout = _layout_section()
    entries: dict[str, str] = {}  # a package's directory -> the text of its entry
    current = None
    for line in layout.splitlines():
        head = re.match(r"^(\S+/)\s", line)
        if head:
            current = head.group(1)
            entries[current] = ""
        if current is not None:
            entries[current] += " " + line
    missing = []
    for name, (path, _) in modules().items():
        if path.name == "__init__.py":
            continue
        directory = path.parent.relative_to(ROOT).as_posix() + "/"
        entry = entries.get(directory, "")
        if not re.search(rf"\b{re.escape(path.stem)}\b", entry):
            missing.append(f"{name} ({directory} entry)")
    assert not missing, "docs/design.md §2 does not name:\n" + "\n".join(sorted(missing))
