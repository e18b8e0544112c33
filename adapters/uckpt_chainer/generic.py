"""Any other Chainer object with ``serialize()``: iterators, extensions, triggers, summaries.

save: ``extract`` returns what ``obj.serialize`` writes. A ``SerialIterator``
gives ``current_position``, ``epoch``, ``is_new_epoch``, ``order`` (the
shuffled order of the current epoch) and ``previous_epoch_detail``; it draws
the next epoch's order from its order sampler, by default from NumPy's global
generator (captured by ``uckpt.RandomState()``); a ``ShuffleOrderSampler``
given its own ``numpy.random.RandomState`` needs that generator in the state
mapping too.
load: ``prepare`` checks the shape and dtype of every saved array that would
be copied into a live one (an iterator's order must match the dataset's
length); ``restore`` runs ``obj.serialize`` with the loaded tree. Which
entries are required is the object's business, as with Chainer's
``load_npz``: a missing one raises a KeyMismatchError during ``restore``.
"""
from __future__ import annotations

from uckpt.adapter import Adapter

from .checks import Findings, compare_arrays, require_dict
from .serializer import probe, restore_with, serialize_tree


def serialize_object(obj, s) -> None:
    obj.serialize(s)


class SerializableAdapter(Adapter):
    name = "chainer.serializable"

    def handles(self, obj):
        return callable(getattr(obj, "serialize", None)) and not isinstance(obj, type)

    def extract(self, obj):
        return serialize_tree(obj, serialize_object)

    def prepare(self, obj, spec):
        findings = Findings(f"the {type(obj).__name__}")
        compare_arrays(probe(obj, serialize_object),
                       require_dict(spec, f"the {type(obj).__name__}"), findings)
        findings.raise_if_any()
        return None

    def restore(self, obj, tree):
        restore_with(obj, tree, serialize_object, f"the {type(obj).__name__}")
