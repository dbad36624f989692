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
    _row_independent_dot(interpreter)
    return True


def _row_independent_dot(interpreter) -> None:
    """The interpreter's ``tl.dot`` with NumPy's own sum-of-products loop instead of ``np.matmul``.

    ``np.matmul`` goes to the BLAS NumPy ships (OpenBLAS, dispatched by CPU): on an AMD EPYC its sgemm gives a
    row of a 64 x 16 @ 16 x 64 product other bits when the same row sits at another row of the tile (11 of
    64 rows after a shift by one), so an interpreted tile kernel was not row-independent there, where a GPU's
    MMA is, and the CPU suite's row-independence checks failed on that CPU alone. ``np.einsum`` (no BLAS,
    one loop order for every output element) gives a row the same bits wherever it sits, on any CPU.
    """
    builder = interpreter.InterpreterBuilder
    original = builder.create_dot
    if getattr(original, "_llm42_row_independent", False):
        return

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if (a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating()) or \
                (b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()):
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        import numpy as np

        out = np.einsum("...mk,...kn->...mn", a.data, b.data, dtype=d.data.dtype)
        return interpreter.TensorHandle(out + d.data, d.dtype.scalar)

    create_dot._llm42_row_independent = True
    builder.create_dot = create_dot


def is_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
