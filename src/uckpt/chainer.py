"""Chainer integration: ``uckpt.chainer.snapshot`` and ``uckpt.chainer.resume``.

A thin public face of the ``uckpt_chainer`` adapter package (installed with
uckpt; ``pip install 'uckpt[chainer]'`` adds Chainer itself). Importing this
module makes Chainer 7.8.1 importable under NumPy 2 (see
``uckpt_chainer.compat``), then imports Chainer::

    import uckpt, uckpt.chainer        # first, under NumPy 2
    import chainer

    trainer.extend(uckpt.chainer.snapshot(manager, trigger=(1, "epoch")))
    uckpt.chainer.resume(manager, trainer)
    trainer.run()

``import uckpt`` alone never imports this module (nor Chainer).
"""
from uckpt_chainer import compat  # noqa: F401  (applies the NumPy 2 shim first)
from uckpt_chainer.extension import Snapshot, checkpoint_state, resume, snapshot

__all__ = ["Snapshot", "checkpoint_state", "compat", "resume", "snapshot"]
