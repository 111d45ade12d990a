"""Only here to hand cffi's build hook to setuptools; metadata is in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["native/build.py:ffibuilder"])
