"""Programs built on walkit's public API, shipped with the package.

:mod:`walkit.examples.kvstore` is a replicated key-value store on a ``WriteAheadLog``
(``README.md`` here describes it). It is ordinary user code - it imports only ``walkit``
and ``walkit.errors`` - that lives inside the package so that ``walkit demo``, which
runs it, works from any install, not only from a source checkout.
"""
