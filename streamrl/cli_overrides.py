"""Command lines whose `key=value` config overrides may follow flags
(`launch cfg.yaml --learners 2 a.b=1`), shared by `streamrl` and `streamrl bench`."""

from __future__ import annotations

import argparse


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, where argparse would stop at overrides after a flag: every
    `key=value` it leaves behind joins ``overrides``; anything else is refused as argparse
    refuses an unknown argument (one line, exit 2)."""
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args
