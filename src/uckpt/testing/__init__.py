"""Helpers for testing code that uses uckpt, and adapters for uckpt (not imported by
``import uckpt``; nothing here imports a framework or pytest until it is used).

* :mod:`uckpt.testing.adapters`: the adapter conformance suite
  (:class:`AdapterCase`, :class:`AdapterConformance` for pytest, :func:`check_adapter`);
* :mod:`uckpt.testing.threads`: ranks as threads of one process
  (:func:`run_ranks`, :class:`ThreadCommunicator`) for fast tests of collective saves;
* :mod:`uckpt.testing.store_tests`: the blob store conformance suite (:class:`StoreTests`,
  for pytest) that every :class:`uckpt.storage.blob.BlobStore` passes.
"""
from __future__ import annotations

_EXPORTS = {
    "AdapterCase": "adapters", "AdapterConformance": "adapters", "check_adapter": "adapters",
    "ConformanceError": "adapters", "registered": "adapters",
    "ThreadCommunicator": "threads", "ThreadWorld": "threads", "run_ranks": "threads",
    "StoreTests": "store_tests",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'uckpt.testing' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
