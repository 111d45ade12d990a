"""cffi build script for ``bookie._native``, the C shim under :mod:`bookie.native`.

Theory of operation
-------------------
API mode: cffi generates a CPython extension that includes ``walkit_native.h`` and is
linked with ``walkit_native.c``; the C compiler checks every declaration against the
real header. The ``cdef`` is not retyped here: it is the text of the header between
its ``/* cdef-begin */`` and ``/* cdef-end */`` markers, so the two cannot drift.

The GIL: in API mode cffi wraps every call of a ``lib`` function in
``Py_BEGIN_ALLOW_THREADS`` / ``Py_END_ALLOW_THREADS`` (see ``_cffi_f_wk_pwrite`` and
friends in the generated C, ``cffi/recompiler.py``), so a thread blocked in
``wk_fdatasync`` or ``wk_pwrite`` does not stop the other Python threads. Nothing in
the shim touches Python objects, which is what makes that safe.

How it is built: ``setup.py`` names this file in ``cffi_modules``, so
``pip install .`` builds the extension into the wheel and ``pip install -e .`` builds
it in place (``bookie/_native.abi3.so`` next to ``bookie/native.py``); without a working
compiler ``setup.py`` leaves it out with one warning (the pure-Python backend then serves,
see ``bookie.native``), and ``MANIFEST.in`` puts this directory in the sdist. setuptools runs
this script with the project root as the working directory and ``__file__`` relative
to it, and wants relative source paths; both hold for the paths below.
"""

from __future__ import annotations

import os

import cffi

HERE = os.path.dirname(__file__) or "."
HEADER = os.path.join(HERE, "walkit_native.h")
SOURCE = os.path.join(HERE, "walkit_native.c")

_BEGIN = "/* cdef-begin */"
_END = "/* cdef-end */"


def cdef_text(header: str = HEADER) -> str:
    """The declarations of ``header`` between the cdef markers."""
    with open(header, encoding="utf-8") as f:
        text = f.read()
    start, end = text.index(_BEGIN) + len(_BEGIN), text.index(_END)
    return text[start:end]


ffibuilder = cffi.FFI()
ffibuilder.cdef(cdef_text())
ffibuilder.set_source(
    "bookie._native",
    '#include "walkit_native.h"',
    sources=[SOURCE],
    include_dirs=[HERE],
    depends=[HEADER],
    extra_compile_args=["-O2", "-Wall"],
)
