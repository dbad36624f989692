"""The GPU tests' monkeypatches name attributes that exist, checked on the CPU.

The GPU tests skip without CUDA, so nothing on the CPU runs them, and a constant moved by a refactor stays unnoticed
until a device runs the test: round 41's first GPU run of ``test_a_triton_head_on_the_wanted_rows_...`` since round 35
failed on ``monkeypatch.setattr(canonical_pass, "SMALLEST_RESULTS", ...)``, a constant that had moved to
``pass_shapes``. This imports each GPU test module (importing needs no GPU) and resolves every
``monkeypatch.setattr(<name>, "<attribute>", ...)`` in it against the module's own names. Negative control: a
patch of a missing attribute in a module written here is reported.
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

GPU_TESTS = Path(__file__).resolve().parent / "gpu"


def stale_patches(source: str, namespace: dict) -> list[str]:
    """``monkeypatch.setattr(<name>, "<attribute>", ...)`` calls in ``source`` whose attribute ``namespace[<name>]``
    lacks (a name missing from the namespace counts as stale too)."""
    stale = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "monkeypatch"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            continue
        target, attribute = node.args[0].id, node.args[1].value
        if target not in namespace or not hasattr(namespace[target], attribute):
            stale.append(f"line {node.lineno}: monkeypatch.setattr({target}, {attribute!r}, ...)")
    return stale


def test_every_gpu_test_patches_an_existing_attribute():
    checked = 0
    problems = {}
    for path in sorted(GPU_TESTS.glob("test_*.py")):
        module = importlib.import_module(f"tests.gpu.{path.stem}")
        source = path.read_text()
        checked += source.count("monkeypatch.setattr(")
        found = stale_patches(source, vars(module))
        if found:
            problems[path.name] = found
    assert not problems, problems
    assert checked > 0, "no GPU test patches anything: the check saw nothing"


def test_a_stale_patch_is_reported():
    """Negative control: the module below has ``present``, not ``moved``."""
    fake = types.ModuleType("fake")
    fake.present = 1
    source = ("def test_x(monkeypatch):\n"
              "    monkeypatch.setattr(fake, 'present', 2)\n"
              "    monkeypatch.setattr(fake, 'moved', 3)\n"
              "    monkeypatch.setattr(absent, 'anything', 4)\n")
    assert stale_patches(source, {"fake": fake}) == ["line 3: monkeypatch.setattr(fake, 'moved', ...)",
                                                     "line 4: monkeypatch.setattr(absent, 'anything', ...)"]
