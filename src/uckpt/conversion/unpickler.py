"""A restricted unpickler: pickles are read as data, never as code.

A pickle can name any importable global (``os.system``, ``builtins.exec``) and
call it while it is read. :class:`RestrictedUnpickler` resolves a global only
through an allowlist that maps ``module.name`` to uckpt's *own* stand-in: a
plain class or function written here, never the real one, and never imported.
Every other global is refused with :class:`RefusedGlobalError` naming it,
before anything runs. The opcodes that create objects (REDUCE, NEWOBJ, BUILD,
INST, OBJ) can only reach callables that came out of the allowlist, so
resolving globals is the single door that needs guarding.

The stand-ins here are the generic ones; ``torch_pickle`` and ``dcp`` add
their own.
"""
from __future__ import annotations

import _compat_pickle
import io
import pickle
import pickletools
import reprlib
import struct
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..errors import CorruptCheckpointError, UckptError
from . import limits
from .errors import RefusedGlobalError, UnsafeInputError

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 60, 60


def short(obj: Any) -> str:
    """A bounded ``repr`` of anything a pickle made (shared, nested or huge values
    included): for messages."""
    try:
        return _SHORT.repr(obj)[:200]
    except Exception:  # a stand-in's repr cannot fail, but a message must never raise
        return f"<{type(obj).__name__}>"


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that admits only the globals of ``allowed`` (name -> stand-in)."""

    def __init__(self, file, allowed: Mapping[str, Any], where: str,
                 persistent: Optional[Callable[[Any], Any]] = None) -> None:
        super().__init__(file, encoding="utf-8")
        self.allowed, self.where, self.persistent = allowed, where, persistent

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (``__builtin__.exec``) as Python 3 ones, as pickle itself maps them
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        key = f"{module}.{name}"
        if key in self.allowed:
            return self.allowed[key]
        raise RefusedGlobalError(
            f"{self.where}: the pickle refers to {key}, which uckpt refuses to load "
            "(it is not a tensor, an array or a plain container, and loading it could run "
            "code); nothing was imported or run", name=key, path=self.where,
            hint="only torch tensors and storages, OrderedDict, plain containers and scalars "
                 "can be converted; save a state_dict() of tensors instead of whole objects")

    def persistent_load(self, pid: Any) -> Any:
        if self.persistent is None:
            raise UnsafeInputError(f"{self.where}: the pickle uses a persistent id "
                                   f"({type(pid).__name__}), which this format does not have",
                                   path=self.where)
        return self.persistent(pid)


_PUTS = frozenset(("PUT", "BINPUT", "LONG_BINPUT"))


def prescan(f, where: str) -> None:
    """Walk the opcodes of the pickle at ``f``'s position (then seek back), before the
    real unpickler runs: every length it declares must be there, and every memo index
    it stores under must be at most the number of opcodes so far (a pickler numbers them
    0, 1, 2, ...; CPython's unpickler would otherwise allocate and clear a memo table of
    the index's size: 32 GiB for a 6-byte pickle)."""
    start = f.tell()
    count = 0
    for op, arg, _ in pickletools.genops(f):
        count += 1
        if op.name in _PUTS and not (type(arg) is int and 0 <= arg <= count):
            raise CorruptCheckpointError(
                f"{where}: the pickle stores memo entry {arg!r} after {count} opcodes (a "
                "pickler numbers them from 0); refused", path=where,
                hint="the file is damaged or was crafted; nothing was unpickled")
    f.seek(start)


def restricted_load(data, allowed: Mapping[str, Any], where: str,
                    persistent: Optional[Callable[[Any], Any]] = None) -> Any:
    """Read one pickle from ``data`` (bytes or a seekable binary file) with
    :class:`RestrictedUnpickler`, after :func:`prescan`, and check the tree it makes with
    :func:`.limits.check_graph` (nodes with shared references expanded, depth, cycles)
    against the limits in force, for the pickle's length.

    Malformed pickles raise :class:`~uckpt.errors.CorruptCheckpointError`; refused globals
    :class:`RefusedGlobalError`; trees over the limits :class:`LimitExceededError`.
    """
    f = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        start = f.tell()
        prescan(f, where)
        root = RestrictedUnpickler(f, allowed, where, persistent).load()
        limits.check_graph(root, f.tell() - start, where, limits.current(), "the pickle")
        return root
    except UckptError:
        raise
    except RecursionError:
        raise CorruptCheckpointError(f"{where}: the pickle nests too deeply",
                                     path=where) from None
    except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError, KeyError,
            IndexError, OverflowError, MemoryError, UnicodeError, struct.error) as e:
        # the only callables reachable are our stand-ins; they raise these on bad arguments
        raise CorruptCheckpointError(f"{where}: not a valid pickle of tensors and plain "
                                     f"values: {type(e).__name__}: {e}", path=where) from None


# -- generic stand-ins -----------------------------------------------------------------------
class Sealed:
    """An object a pickle may create or call, but not change: BUILD (which would otherwise
    update its attributes) is refused."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise TypeError(f"a pickle may not change a {type(self).__name__}")


class StandIn(Sealed):
    """A function of the allowlist, wrapped so a pickle can call it but not modify it."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class OrderedDictStandIn(dict):
    """Stands in for ``collections.OrderedDict``: a dict that remembers it was one, and the
    attributes a BUILD gave it (``state_dict()._metadata``)."""

    def __init__(self, items=()) -> None:
        super().__init__()
        for k, v in items:  # protocol 0/1 pickles pass the items as a list of pairs
            self[k] = v
        self.pickle_state: Optional[Dict[str, Any]] = None

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"OrderedDict state must be a dict, got {type(state).__name__}")
        self.pickle_state = state

    def graph_children(self) -> List[Any]:
        """What :func:`.limits.check_graph` counts: keys, values and the BUILD state."""
        return [*self, *self.values(), self.pickle_state]


def codecs_encode(text: Any, encoding: str = "utf-8") -> bytes:
    """Stands in for ``_codecs.encode``, which protocol-2 pickles use for ``bytes``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise TypeError("_codecs.encode is admitted only as (str, 'latin1') for bytes")
    return text.encode("latin1")


GENERIC = {
    "collections.OrderedDict": OrderedDictStandIn,
    "_codecs.encode": StandIn(codecs_encode),
}
