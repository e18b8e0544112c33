"""Make Chainer 7.8.1 importable and usable under NumPy 2.

Chainer's last release predates NumPy 2, which removed names Chainer uses.
:func:`apply` puts back exactly those, each only when it is missing, with the
value NumPy 1 had, and changes nothing else; under NumPy 1 it does nothing.

====================  =================================  ==========================
name                  where Chainer uses it               put back as
====================  =================================  ==========================
``numpy.sctypes``     ``chainer.functions.array.         NumPy 1's table of scalar
                      as_strided``, at import time:       types by kind (``int``,
                      ``import chainer`` fails without    ``uint``, ``float``,
                      it                                  ``complex``, ``others``)
``numpy.float``       ``F.resize_images``, when called    the builtin ``float``
                                                          (NumPy < 1.24's alias)
``numpy.distutils``   ``chainer._environment_check``, at  an empty stand-in whose
                      import time (its BLAS check runs    ``system_info.get_info``
                      only on macOS); NumPy 2 ships none  returns ``{}``; only where
                      for Python >= 3.12                  NumPy has none
====================  =================================  ==========================

Nothing else Chainer 7.8.1 references is missing from NumPy 2 (its sources
were scanned for every ``numpy.<name>`` and the removed ``ndarray`` methods).
``import uckpt_chainer`` (and so ``import uckpt_chainer.compat`` or
``import uckpt.chainer``) calls :func:`apply` and imports neither Chainer nor
CuPy, so import one of them before ``chainer``. :func:`apply` is idempotent;
:data:`applied` lists what it added.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from typing import List

import numpy as np

#: names :func:`apply` has put into ``numpy`` in this process
applied: List[str] = []


def _sctypes() -> dict:
    """NumPy 1's ``numpy.sctypes``: scalar types by kind, sized types in size order."""
    return {
        "int": [np.int8, np.int16, np.int32, np.int64],
        "uint": [np.uint8, np.uint16, np.uint32, np.uint64],
        "float": [np.float16, np.float32, np.float64, np.longdouble],
        "complex": [np.complex64, np.complex128, np.clongdouble],
        "others": [bool, object, bytes, str, np.void],
    }


def _missing(name: str) -> bool:
    try:
        getattr(np, name)
    except AttributeError:  # NumPy 2's module __getattr__ raises for removed names
        return True
    return False


def _distutils_stub() -> None:
    """An empty ``numpy.distutils.system_info`` where NumPy has no ``numpy.distutils``."""
    system_info = types.ModuleType("numpy.distutils.system_info")
    system_info.get_info = lambda name, notfound_action=0: {}
    system_info.__doc__ = "uckpt_chainer.compat stand-in: NumPy has no numpy.distutils"
    package = types.ModuleType("numpy.distutils")
    package.__path__ = []  # a package, so the submodule import resolves
    package.system_info = system_info
    sys.modules["numpy.distutils"] = package
    sys.modules["numpy.distutils.system_info"] = system_info
    np.distutils = package


def apply() -> List[str]:
    """Put back what Chainer needs and NumPy lacks; return the names added by this call."""
    added = []
    if _missing("sctypes"):
        np.sctypes = _sctypes()
        added.append("sctypes")
    if _missing("float"):
        np.float = float
        added.append("float")
    try:
        has_distutils = importlib.util.find_spec("numpy.distutils") is not None
    except (ImportError, ValueError):
        has_distutils = False
    if not has_distutils:
        _distutils_stub()
        added.append("distutils")
    applied.extend(added)
    return added


def needed() -> bool:
    """Whether this NumPy lacks anything :func:`apply` would put back."""
    try:
        has_distutils = importlib.util.find_spec("numpy.distutils") is not None
    except (ImportError, ValueError):
        has_distutils = False
    return _missing("sctypes") or _missing("float") or not has_distutils
