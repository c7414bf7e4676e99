"""The dependency rules of docs/design.md §2, checked on the source, and its section references.

Every ``.py`` file under ``streamrl/``, ``workers/`` and ``buffers/`` is parsed (``ast``, no
import) and every import statement in it is read: module level, inside functions and
methods, under ``try``. Only imports under ``if TYPE_CHECKING:`` are left out: they never
run. Module names follow ``pyproject.toml``'s ``package-dir`` (``workers/`` is
``streamrl.workers``, ``buffers/`` is ``streamrl.buffers``); ``import workers.x`` and relative
imports are resolved to the same names. The rules (the same words are in §2):

1. ``streamrl.config`` and ``streamrl.protocol`` are leaves: they import no torch and no zmq,
   and of streamrl only modules that themselves import no torch, no zmq and no streamrl
   module (stdlib helpers such as ``streamrl.key_rules``).
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

And every ``docs/design.md §<number>`` cited under ``streamrl/``, ``workers/``, ``buffers/``,
``tests/``, ``docs/``, ``benchmarks/``, ``configs/``, ``scripts/`` and in ``README.md`` (also
spelled ``DESIGN §…``; in design.md itself a bare ``§…``) names a ``## <number>.`` heading of
design.md.
"""

from __future__ import annotations

import ast
import re
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
    assert {"streamrl.config", "streamrl.workers.generator", "streamrl.buffers.server"} <= set(
        names
    )
    assert "streamrl.workers.engines.hf" in names
    assert not any(n.startswith(("workers", "buffers")) for n in names)


def test_resolves_every_spelling() -> None:
    """Relative imports, ``workers.x`` and ``from pkg import module`` name the module."""
    assert _canonical("buffers.delivery") == "streamrl.buffers.delivery"
    targets = {i.target for i in imports_of("streamrl.buffers.server")}
    assert "streamrl.buffers.durable_log" in targets  # ``from .durable_log import DurableLog``
    targets = {i.target for i in imports_of("streamrl.workers.learner")}
    assert "streamrl.workers.checkpoint" in targets  # ``from streamrl.workers import checkpoint``
    local = {i.target for i in imports_of("streamrl.workers.generator")}
    assert "streamrl.workers.evaluator" in local  # a function-local import
    assert "torch" not in {i.target for i in imports_of("streamrl.algorithms")}  # TYPE_CHECKING


def test_config_and_protocol_are_leaves() -> None:
    problems = []
    for leaf in LEAVES:
        for imp in imports_of(leaf):
            if third_party(imp.target, "torch", "zmq"):
                problems.append(f"{imp}: a leaf imports no torch and no zmq")
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
