"""Triton's interpreter for the CPU suite: kernels run on CPU tensors when there is no CUDA device.

``enable()`` must run before any ``triton.jit`` kernel is defined (``tests/conftest.py`` calls it):
``TRITON_INTERPRET=1`` decides, when a kernel is decorated, that it will be interpreted. It also works
around Triton 3.6's interpreter with NumPy >= 2.3, where a scalar is a one-element array that ``int()``
no longer takes (a kernel's ``range(lo, hi)`` over loaded bounds fails without it).
"""

from __future__ import annotations

import importlib.util
import os

import torch


def enable() -> bool:
    """Interpret Triton kernels if Triton imports and CUDA is absent; returns whether they are interpreted."""
    if torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return os.environ.get("TRITON_INTERPRET") == "1"
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ["TRITON_INTERPRET"] != "1":
        return False
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is not None and not getattr(patch, "_llm42_index", False):
        def _patch_lang_tensor(tensor, scope):
            patch(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        _patch_lang_tensor._llm42_index = True
        interpreter._patch_lang_tensor = _patch_lang_tensor
    return True


def is_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
