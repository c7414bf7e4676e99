"""Python objects handed to ``streamrl.train`` (reward functions, environment classes): named in
the config, sent to the roles by value.

A config names code as text (``module:function``), which every role imports for itself. A
function defined in a notebook has no such name: no other process can import ``__main__``'s
cells. So ``streamrl.train`` registers each object here under a name of its own,
``python:<module>.<qualname>`` (``python:my_reward`` for a notebook's; made unique within one
call), and the config names it (``rewards: [{name: python:my_reward}]``), so that the run's
``config.yaml`` shows what ran. ``plugins.load_named`` looks a ``python:`` name up in this
process's table, where a reward, an environment or an engine is resolved by name.

The object reaches the roles as bytes: ``register`` pickles it once with ``cloudpickle`` (by
value for a function of ``__main__`` or a closure; by reference, module and name, for a
function an installed module defines), the controller's spec factory puts the bytes the
config names in every ``GeneratorSpec.callables``, and the generator ``install``s them at the
start of its constructor, before it builds its rewards, its environments or its engine (the
held-out evaluation runs there too, in generator 0). These bytes are the only pickled input
the package reads (``tests/unit/test_no_unsafe_deserialization.py`` allows this module): they
are made in the process that called ``streamrl.train`` from that caller's own objects and
travel inside the spec, which Ray delivers to the actor as it delivers any actor's arguments;
no socket or file of the run carries them.

Why ``check_loadable`` loads them in a fresh process before any role starts: that
``cloudpickle.dumps`` succeeds proves only half. A function pickled by reference loads only
where its module imports, and a notebook's process can import modules no role can: a
directory appended to ``sys.path`` in a cell, an editable path set up at run time. A role
would then fail while the run starts, with Ray's traceback, after the run directory and the
other roles exist. The fresh process sees what a role sees: the same interpreter and
environment, and the same additions to ``sys.path`` that Ray gives its workers (the caller's
working directory, and its script's directory when run as a script), so the failure is a
one-line ``ConfigError`` naming the callable, before anything starts. What cannot be pickled
at all (a closure over a socket, a lock, an open file) fails at ``register`` the same way.

``cloudpickle`` is imported where bytes are made or read (``register``, ``install``, the
fresh process), not with the module: every reward and environment lookup imports this table
(``plugins.load_named``), and a process that resolves only ``module:attr`` names
(``streamrl validate``, the TRL peer's light venv) needs no cloudpickle.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from streamrl.config import Config, ConfigError, to_dict

PREFIX = "python:"
# Loading in a fresh process imports whatever the callables' modules import (torch, say).
CHECK_TIMEOUT_S = 300.0

# This process's objects by name; and their pickled bytes, which the roles are sent.
_OBJECTS: dict[str, Any] = {}
_BLOBS: dict[str, bytes] = {}


def is_python_name(name: str) -> bool:
    return name.startswith(PREFIX)


def base_name(obj: Any) -> str:
    """``python:<module>.<qualname>`` with ``<locals>`` dropped (``python:my_reward`` for a
    notebook's or a script's ``__main__``), in letters, digits, ``_`` and ``.`` only: a name
    that reads well in ``config.yaml`` and says where the object was defined."""
    module = getattr(obj, "__module__", None) or type(obj).__module__
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    parts = [p.strip("<>") for p in qualname.split(".") if p != "<locals>"]
    if module not in ("__main__", "builtins"):
        parts.insert(0, module)
    dotted = ".".join(parts)
    return PREFIX + (re.sub(r"[^A-Za-z0-9_.]", "_", dotted) or "callable")


def register(objects: Iterable[tuple[str, Any]]) -> dict[int, str]:
    """Register ``objects``, ``(what, object)`` pairs (``("reward", my_reward)``; one
    ``streamrl.train`` call's), and give each object its name, keyed by ``id``: the same
    object always gets one name, and two objects that would share one are told apart (``-2``,
    ``-3``). A name an earlier call registered is taken over: a notebook that redefines
    ``my_reward`` and trains again runs the new one under the same name. ``ConfigError``
    naming the object if ``cloudpickle`` cannot pickle it; then nothing is registered."""
    import cloudpickle

    names: dict[int, str] = {}
    pending: dict[str, tuple[Any, bytes]] = {}
    for what, obj in objects:
        if id(obj) in names:
            continue
        name = base = base_name(obj)
        suffix = 1
        while name in pending:
            suffix += 1
            name = f"{base}-{suffix}"
        try:
            blob = cloudpickle.dumps(obj)
        except Exception as exc:  # whatever the object holds: a socket, a lock, a generator
            raise ConfigError(
                f"{what} {label(obj)} cannot be sent to the roles: cloudpickle cannot "
                f"pickle it ({_one_line(exc)})"
            ) from None
        names[id(obj)] = name
        pending[name] = (obj, blob)
    for name, (obj, blob) in pending.items():  # all or nothing
        _OBJECTS[name], _BLOBS[name] = obj, blob
    return names


def label(obj: Any) -> str:
    """How a message names a callable: its qualified name as written (``my_reward``)."""
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


def lookup(name: str, key: str) -> Any:
    """The object registered as ``name``; ``ConfigError`` naming the config ``key`` if this
    process has none (a config naming one runs only from the ``streamrl.train`` call that
    registered it)."""
    try:
        return _OBJECTS[name]
    except KeyError:
        raise ConfigError(
            f"{key} {name!r} is not registered in this process: a python: name is one of the "
            "callables streamrl.train was given, and runs only from that call"
        ) from None


def referenced(config: Config) -> list[str]:
    """Every ``python:`` name the config holds, wherever (rewards and their args, env.name,
    eval.check, generator.engine): what the roles may resolve."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, str):
            if is_python_name(node):
                found.add(node)
        elif isinstance(node, Mapping):
            for value in node.values():
                walk(value)
        elif isinstance(node, list | tuple):
            for value in node:
                walk(value)

    walk(to_dict(config))
    return sorted(found)


def blobs_for(config: Config) -> dict[str, bytes]:
    """The pickled bytes of every callable ``config`` names: what a role is sent."""
    missing = [name for name in referenced(config) if name not in _BLOBS]
    if missing:
        lookup(missing[0], "config")  # raises, naming it
    return {name: _BLOBS[name] for name in referenced(config)}


def install(blobs: Mapping[str, bytes]) -> None:
    """In a role: register what the controller sent (``GeneratorSpec.callables``), so that
    ``plugins.load_named`` finds each name here as in the controller's process."""
    import cloudpickle

    for name, blob in blobs.items():
        _OBJECTS[name] = cloudpickle.loads(blob)
        _BLOBS[name] = blob


def check_loadable(names: Iterable[str], labels: Mapping[str, str] | None = None) -> None:
    """Load the registered ``names`` in a fresh process with the roles' environment (module
    doc: why); ``ConfigError`` naming each one that does not load and why, on one line.
    ``labels``: how to call each name in the message (``reward my_reward``)."""
    names = list(names)
    for name in names:
        if name not in _BLOBS:
            lookup(name, "config")  # raises, naming it
    blobs = {name: _BLOBS[name] for name in names}
    if not blobs:
        return
    labels = labels or {}
    request = msgspec.msgpack.encode({"paths": role_sys_path(), "blobs": blobs})
    try:
        done = subprocess.run(
            [sys.executable, "-m", "streamrl.callables"],
            input=request,
            capture_output=True,
            timeout=CHECK_TIMEOUT_S,
            cwd=os.getcwd(),
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"{', '.join(labels.get(n, n) for n in blobs)}: loading in a fresh process took "
            f"more than {CHECK_TIMEOUT_S:.0f} s"
        ) from None
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        failures: dict[str, str] = json.loads(lines[-1]) if done.returncode == 0 else None
    except (IndexError, ValueError):
        failures = None
    if failures is None:  # the loader itself failed: its last words
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"cannot check the callables in a fresh process: {last}")
    if failures:
        reasons = "; ".join(
            f"{labels.get(name, name)} ({name}) does not load in the roles' processes: {why}"
            for name, why in failures.items()
        )
        raise ConfigError(reasons + _import_hint(failures.values()))


def role_sys_path() -> list[str]:
    """What Ray puts before a worker's ``sys.path`` for a driver started in this process
    (``ray._private.worker.connect``): the script's directory when ``__main__`` is a script
    run from its directory's path entry, and the working directory. Nothing else the caller
    added to ``sys.path`` reaches the roles."""
    import __main__

    paths = []
    main_file = getattr(__main__, "__file__", None)  # none in a notebook or a REPL
    if main_file:
        script_dir = os.path.dirname(os.path.realpath(sys.argv[0]))
        if script_dir in sys.path:
            paths.append(script_dir)
    paths.append(os.path.abspath(os.curdir))
    return paths


def _import_hint(reasons: Iterable[str]) -> str:
    unimportable = ("ModuleNotFoundError", "ImportError", "AttributeError")
    if not any(reason.startswith(unimportable) for reason in reasons):
        return ""
    return (
        " (cloudpickle sends a function of an importable module by name, and the roles "
        "cannot import that module: install it, run from its directory, define the function "
        "in the notebook, or call cloudpickle.register_pickle_by_value(module) first)"
    )


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _load_in_this_process() -> int:
    """``python -m streamrl.callables``: ``check_loadable``'s fresh process. Reads the
    request on stdin, loads each callable, and writes ``{name: why}`` for those that failed
    as its last line of stdout (a module it imports may print before)."""
    import cloudpickle

    request = msgspec.msgpack.decode(sys.stdin.buffer.read())
    sys.path[:0] = [p for p in request["paths"] if p not in sys.path]
    failures = {}
    for name, blob in request["blobs"].items():
        try:
            cloudpickle.loads(blob)
        except BaseException as exc:  # noqa: BLE001 - whatever loading raises is the answer
            failures[name] = _one_line(exc)
    sys.stdout.write("\n" + json.dumps(failures) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_load_in_this_process())
