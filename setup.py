"""cffi's build hook for setuptools, with the C shim optional; metadata is in pyproject.toml.

Theory of operation
-------------------
Two C extensions: ``cffi_modules`` adds ``bookie._native``, the I/O shim
(``native/build.py``), and ``ext_modules`` adds ``bookie._frames``, the journal's frame
packing (``native/walkit_frames.c``). Building them needs a C compiler and Python's
headers; without them the install still succeeds: :class:`OptionalBuildExt` catches the
compiler's failure, prints ONE warning (however many extensions failed), and leaves them
out, so ``bookie.native`` falls back to its pure-Python backend and the journal frames
in Python (``WALKIT_NATIVE=auto``, the default). ``WALKIT_NATIVE=require`` in the build's
environment turns the failure back into an error (a packager who wants them for sure).

Both are built for CPython's stable ABI (``*.abi3.so``: cffi does it for the shim, the
limited API of 3.11 for the frames), so the wheel is tagged ``cp311-abi3``: one wheel
serves CPython 3.11 and every newer one. Builds where the stable ABI does not apply
(PyPy, free-threaded, debug CPython) keep their own tag.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

_BUILD_ERRORS = (CCompilerError, ExecError, PlatformError)
_WARNING = """
WARNING: walkit's C extensions (bookie._native, bookie._frames) were not built; walkit
         works without them, on pure Python (slower journal writes). To get them, install
         a C compiler and Python's headers (Debian: apt-get install gcc python3-dev) and
         install walkit again. The build failed with: {error}
"""


class OptionalBuildExt(build_ext):
    """``build_ext`` that lets the C extensions' builds fail with one warning (see the module docstring)."""

    _warned = False

    def run(self) -> None:
        required = os.environ.get("WALKIT_NATIVE", "").strip().lower() == "require"
        for ext in self.extensions:
            ext.optional = not required  # setuptools then copies in place (editable) only what was built
        super().run()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except _BUILD_ERRORS as exc:  # no compiler, no Python.h, a compiler or linker error
            if not ext.optional:
                raise
            if not self._warned:
                self._warned = True
                sys.stderr.write(_WARNING.format(error=exc))
                sys.stderr.flush()


def _stable_abi_wheel() -> dict[str, Any]:
    """``bdist_wheel`` options: the ``cp311-abi3`` tag where cffi builds for the stable ABI."""
    if (sys.implementation.name != "cpython" or hasattr(sys, "gettotalrefcount")
            or sysconfig.get_config_var("Py_GIL_DISABLED")):
        return {}
    return {"bdist_wheel": {"py_limited_api": "cp311"}}


def _frames_extension() -> Extension:
    """``bookie._frames`` (``native/walkit_frames.c``): journal frames packed in C, on
    CPython's limited API (3.11), so it shares the wheel's ``abi3`` tag with the shim."""
    limited = bool(_stable_abi_wheel())
    return Extension(
        "bookie._frames", ["native/walkit_frames.c", "native/walkit_wire.c"], py_limited_api=limited,
        define_macros=[("Py_LIMITED_API", "0x030B0000")] if limited else [],
        extra_compile_args=["-O2", "-Wall"],
    )


setup(cffi_modules=["native/build.py:ffibuilder"], ext_modules=[_frames_extension()],
      cmdclass={"build_ext": OptionalBuildExt}, options=_stable_abi_wheel())
