"""cffi's build hook for setuptools, with the C shim optional; metadata is in pyproject.toml.

Theory of operation
-------------------
``cffi_modules`` adds ``bookie._native`` (``native/build.py``) to the build. Building it
needs a C compiler and Python's headers; without them the install still succeeds:
:class:`OptionalBuildExt` catches the compiler's failure, prints ONE warning, and leaves
the extension out, so ``bookie.native`` falls back to its pure-Python backend
(``WALKIT_NATIVE=auto``, the default). ``WALKIT_NATIVE=require`` in the build's
environment turns the failure back into an error (a packager who wants the shim for sure).

cffi builds the shim for CPython's stable ABI (``_native.abi3.so``), so the wheel is
tagged ``cp311-abi3``: one wheel serves CPython 3.11 and every newer one. Builds where
cffi does not use the stable ABI (PyPy, free-threaded, debug CPython) keep their own tag.
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
WARNING: walkit's C I/O shim (bookie._native) was not built; walkit works without it, on
         its pure-Python I/O backend (slower journal writes). To get the shim, install a
         C compiler and Python's headers (Debian: apt-get install gcc python3-dev) and
         install walkit again. The build failed with: {error}
"""


class OptionalBuildExt(build_ext):
    """``build_ext`` that lets the C shim's build fail with one warning (see the module docstring)."""

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
            sys.stderr.write(_WARNING.format(error=exc))
            sys.stderr.flush()


def _stable_abi_wheel() -> dict[str, Any]:
    """``bdist_wheel`` options: the ``cp311-abi3`` tag where cffi builds for the stable ABI."""
    if (sys.implementation.name != "cpython" or hasattr(sys, "gettotalrefcount")
            or sysconfig.get_config_var("Py_GIL_DISABLED")):
        return {}
    return {"bdist_wheel": {"py_limited_api": "cp311"}}


setup(cffi_modules=["native/build.py:ffibuilder"], cmdclass={"build_ext": OptionalBuildExt},
      options=_stable_abi_wheel())
