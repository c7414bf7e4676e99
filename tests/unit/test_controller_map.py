"""The controller package's docstring is its map: it names every module the package has."""

from __future__ import annotations

import re
from pathlib import Path

import streamrl.controller


def test_the_controller_docstring_names_every_module_and_only_those() -> None:
    package = Path(streamrl.controller.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} - {"__init__"}
    doc = streamrl.controller.__doc__ or ""
    # Module names are the ``name`` items before each entry's colon.
    listed = {
        name
        for line in doc.splitlines()
        if line.startswith("- ")
        for name in re.findall(r"``(\w+)``", line.split(":", 1)[0])
    }
    assert modules - listed == set(), "add these to streamrl/controller/__init__.py's docstring"
    assert listed - modules == set(), "these are listed but do not exist"
