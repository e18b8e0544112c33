"""``chainer.Link`` (``Chain``, ``ChainList``, ``Sequential``, every built-in link).

save: ``extract`` returns what ``link.serialize`` writes: every parameter and
persistent value (BatchNormalization's ``avg_mean``, ``avg_var`` and ``N``)
under its path (``conv1/W``, ``0/bn/avg_mean``), arrays viewing the live ones
(device arrays copied to the host). An uninitialized parameter is ``None``.
load: ``prepare`` compares the paths, shapes and dtypes with the link and
raises one error listing every difference before anything changes (a renamed
child link gives a :class:`~uckpt.errors.KeyMismatchError` with the missing and
the unexpected paths); it returns the parameters' own NumPy arrays as read
targets, so the core reads straight into them. ``restore`` runs
``link.serialize`` with the loaded tree: uninitialized parameters are
initialized with the saved shape, other arrays are copied in unless the core
already read them in place, persistent values are set to what was saved.
"""
from __future__ import annotations

import weakref

import chainer

from uckpt.adapter import Adapter

from .checks import Findings, compare_strict, nest, require_dict
from .serializer import probe, restore_with, serialize_tree

HINT = "build the same architecture (the same child link names) that was saved"


def serialize_link(link, s) -> None:
    link.serialize(s)


def check_link(link, live, saved, findings: Findings, prefix: str = ""):
    """Compare a link's probed tree with the checkpoint's; return in-place targets."""
    require_dict(saved, f"the {type(link).__name__} link")
    return nest(compare_strict(live, saved, findings, prefix))


class LinkAdapter(Adapter):
    name = "chainer.link"
    partial = True  # strict=False: the entries both hold are loaded, the others reported

    def __init__(self) -> None:
        #: links being loaded with strict=False (from ``prepare`` to ``restore``)
        self._partial: "weakref.WeakSet" = weakref.WeakSet()

    def handles(self, obj):
        return isinstance(obj, chainer.Link)

    def extract(self, obj):
        return serialize_tree(obj, serialize_link)

    def prepare(self, obj, spec, keys=None):
        findings = Findings(f"the {type(obj).__name__} link")
        targets = check_link(obj, probe(obj, serialize_link), spec, findings)
        self._partial.discard(obj)
        if keys is not None:
            findings.report_keys(keys)
            self._partial.add(obj)
        findings.raise_if_any(HINT)
        return targets

    def restore(self, obj, tree):
        strict = obj not in self._partial
        self._partial.discard(obj)
        restore_with(obj, tree, serialize_link, f"the {type(obj).__name__} link", strict)
