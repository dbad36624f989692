"""Run a module (``-m NAME ARGS``, as ``python -m``) or a script (``PATH.py ARGS``) in this process: the tail of
the device wrappers that swap a part of llm42 for a baseline's before running a benchmark (with_r19_attention.py,
with_round20_canonical.py)."""

from __future__ import annotations

import runpy
import sys


def run_target(argv: list[str], usage: str) -> None:
    is_module = argv[:1] == ["-m"]
    if (is_module and len(argv) < 2) or (not is_module and not (argv and argv[0].endswith(".py"))):
        raise SystemExit(f"usage: {usage} (-m MODULE | SCRIPT.py) [ARGS...]")
    if is_module:
        sys.argv = [argv[1]] + argv[2:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
