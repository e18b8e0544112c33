"""TensorFlow checkpoint keys <-> uckpt paths (no TensorFlow needed).

An object-based checkpoint (``tf.train.Checkpoint``, tf_keras ``save_weights``) names each
tensor by the object-graph path to its variable and the attribute saved
(``model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE``); an optimizer's slot
variable by the variable it belongs to, the optimizer and the slot's name
(``model/.../kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE``).
TensorFlow escapes the names in a path (``/`` as ``.S``, ``.`` as ``..``), so a component
starting with ``.`` and a capital letter is never a name: the mapping below is one to one.

======================================================  ==========================
TensorFlow key                                          uckpt path
======================================================  ==========================
``P/.ATTRIBUTES/VARIABLE_VALUE``                        ``P``
``V/.OPTIMIZER_SLOT/O/S/.ATTRIBUTES/VARIABLE_VALUE``    ``O/.OPTIMIZER_SLOT/S/V``
``P/.ATTRIBUTES/A`` (another attribute: ``py_state``)   ``P/.ATTRIBUTES/A``
a name-based (TF1 ``Saver``) key                        the key itself
======================================================  ==========================

Slots go under their optimizer (``optimizer/.OPTIMIZER_SLOT/m/model/.../kernel``), so
``--select optimizer`` picks the whole optimizer state, and a variable never is both an
array and the group of its slots.
"""
from __future__ import annotations

from typing import List

ATTRIBUTES = ".ATTRIBUTES"
VALUE = "VARIABLE_VALUE"
SLOT = ".OPTIMIZER_SLOT"
#: the key of the serialized ``TrackableObjectGraph`` proto of an object-based checkpoint
GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def is_object_key(key: str) -> bool:
    """Whether ``key`` names an attribute of an object-graph node (``.../.ATTRIBUTES/A``)."""
    parts = key.split("/")
    return len(parts) >= 3 and parts[-2] == ATTRIBUTES


def to_path(key: str) -> List[str]:
    """The uckpt path components of an object-based checkpoint key (see the table)."""
    parts = key.split("/")
    if not is_object_key(key):
        return parts
    obj, tail = parts[:-2], ([] if parts[-1] == VALUE else parts[-2:])
    if SLOT in obj:
        i = obj.index(SLOT)
        if i > 0 and len(obj) - i >= 3:  # V/.OPTIMIZER_SLOT/O.../S
            obj = obj[i + 1:-1] + [SLOT, obj[-1]] + obj[:i]
    return obj + tail


def to_key(parts: List[str]) -> str:
    """The object-based checkpoint key of uckpt path components (inverse of :func:`to_path`)."""
    if len(parts) >= 3 and parts[-2] == ATTRIBUTES:
        obj, tail = parts[:-2], parts[-2:]
    else:
        obj, tail = list(parts), [ATTRIBUTES, VALUE]
    if SLOT in obj:
        i = obj.index(SLOT)
        if i > 0 and len(obj) - i >= 3:  # O.../.OPTIMIZER_SLOT/S/V...
            obj = obj[i + 2:] + [SLOT] + obj[:i] + [obj[i + 1]]
    return "/".join(obj + tail)
