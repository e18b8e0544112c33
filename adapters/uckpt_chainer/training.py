"""``chainer.training.Trainer`` and its updater (``StandardUpdater`` and subclasses).

save: ``extract`` returns what ``trainer.serialize`` writes, which is what
``chainer.training.extensions.snapshot`` saves: under ``updater/`` each
iterator (``iterator:main``: position, epoch, shuffled order), each optimizer
(``optimizer:main``, with the additions described in :mod:`.optim`), each
model (``model:main``) and the iteration count; ``stop_trigger/``;
``extensions/`` and ``extension_triggers/`` by extension name (LogReport's
log and running summary, the state of shift extensions, each trigger's
position); and the elapsed time. An updater on its own gives its
``updater/`` part.

load: ``prepare`` checks, before anything changes: the updater's iterators,
optimizers and models by name; each model strictly (paths, shapes, dtypes;
see :mod:`.link`) and each optimizer (see :mod:`.optim`); every extension or
trigger with state in the trainer must have state in the checkpoint (register
extensions added for the resumed run after restoring); the shape and dtype of
every array that would be copied into a live one (e.g. an iterator's order,
which must match the dataset's length). State in the checkpoint for an
extension the trainer lacks is ignored with a warning. It returns the models'
parameters and initialized optimizer states as in-place read targets.
``restore`` runs ``trainer.serialize`` with the loaded tree (Chainer's own
loading logic for every part), then the optimizers' additions. Entries that
Chainer's objects treat as optional (an iterator's or extension's) are not
checked up front: one that is missing raises a KeyMismatchError during
``restore``, as Chainer's ``load_npz`` would raise a KeyError.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict

from chainer.training import Trainer, Updater
from chainer.training.updaters import StandardUpdater

from uckpt.adapter import Adapter

from .checks import Findings, compare_arrays, leaf_problem, require_dict
from .link import check_link
from .optim import check_optimizer, serialize_additions
from .serializer import probe, restore_with, serialize_tree

HINT = ("create the trainer as it was saved: the same models (child link names), optimizers, "
        "iterators and extensions; register extensions added for the resumed run after restoring")


def serialize_updater(updater, s) -> None:
    """``updater.serialize(s)``, then each optimizer's additions (StandardUpdater)."""
    updater.serialize(s)
    if isinstance(updater, StandardUpdater):
        for name, opt in updater.get_all_optimizers().items():
            serialize_additions(opt, s["optimizer:" + name], hyperparameters=False)


def serialize_trainer(trainer, s) -> None:
    """``trainer.serialize(s)``, then the updater's optimizers' additions."""
    with _elapsed_time_readable(trainer):
        trainer.serialize(s)
    if isinstance(trainer.updater, StandardUpdater):
        for name, opt in trainer.updater.get_all_optimizers().items():
            serialize_additions(opt, s["updater"]["optimizer:" + name],
                                hyperparameters=False)


@contextmanager
def _elapsed_time_readable(trainer):
    """Let ``Trainer.serialize`` save a trainer that has not run yet.

    It saves ``trainer.elapsed_time``, which raises before ``run()``. Until
    then the elapsed time is exactly what a restore left in
    ``_snapshot_elapsed_time`` (or 0), which is what a finished trainer
    reports through ``_final_elapsed_time``: pretend to be finished meanwhile.
    """
    if getattr(trainer, "_start_at", None) is not None or getattr(trainer, "_done", True):
        yield
        return
    trainer._done = True
    trainer._final_elapsed_time = getattr(trainer, "_snapshot_elapsed_time", 0.0)
    try:
        yield
    finally:
        trainer._done = False
        del trainer._final_elapsed_time


def check_updater(updater, live, saved, findings: Findings, prefix: str = "") -> Dict[str, Any]:
    """Compare an updater's probed tree with the checkpoint's; return in-place targets."""
    at = (lambda p: f"{prefix}/{p}") if prefix else (lambda p: p)
    saved = require_dict(saved, f"the {type(updater).__name__}")
    if not isinstance(updater, StandardUpdater):
        compare_arrays(live, saved, findings, prefix)
        return {}
    findings.missing += [at(k) for k in live if k not in saved]
    findings.unexpected += [at(k) for k in saved if k not in live]
    targets: Dict[str, Any] = {}
    optimizers = updater.get_all_optimizers()
    for key in live.keys() & saved.keys():
        kind, _, name = key.partition(":")
        if kind == "model" and name in optimizers:
            targets[key] = check_link(optimizers[name].target, live[key], saved[key], findings,
                                      at(key))
        elif kind == "optimizer" and name in optimizers:
            targets[key] = check_optimizer(optimizers[name], live[key], saved[key], findings,
                                           at(key))
        elif isinstance(live[key], dict):
            compare_arrays(live[key], saved[key], findings, at(key))
        else:
            findings.add(leaf_problem(at(key), live[key], saved[key], strict=False))
    return targets


def check_trainer(trainer, live, saved, findings: Findings) -> Dict[str, Any]:
    saved = require_dict(saved, "the Trainer")
    if "updater" not in saved:
        findings.missing.append("updater")
        return {}
    targets = {"updater": check_updater(trainer.updater, live.get("updater", {}),
                                        saved["updater"], findings, "updater")}
    for section in ("extensions", "extension_triggers"):
        mine, theirs = live.get(section, {}), saved.get(section, {})
        findings.missing += [f"{section}/{k}" for k in mine if k not in theirs]
        ignored = [k for k in theirs if k not in mine]
        if ignored:
            findings.notes.append(
                f"uckpt: the checkpoint holds {section} state for {', '.join(sorted(ignored))}, "
                "which this trainer does not have; it was not restored")
        for key in mine.keys() & theirs.keys():
            compare_arrays(mine[key], theirs[key], findings, f"{section}/{key}")
    if "stop_trigger" in live and "stop_trigger" in saved:
        compare_arrays(live["stop_trigger"], saved["stop_trigger"], findings, "stop_trigger")
    return targets


class TrainerAdapter(Adapter):
    name = "chainer.trainer"

    def handles(self, obj):
        return isinstance(obj, Trainer)

    def extract(self, obj):
        return serialize_tree(obj, serialize_trainer)

    def prepare(self, obj, spec):
        findings = Findings("the Trainer")
        targets = check_trainer(obj, probe(obj, serialize_trainer), spec, findings)
        findings.raise_if_any(HINT)
        return targets

    def restore(self, obj, tree):
        restore_with(obj, tree, serialize_trainer, "the Trainer")


class UpdaterAdapter(Adapter):
    name = "chainer.updater"

    def handles(self, obj):
        return isinstance(obj, Updater)

    def extract(self, obj):
        return serialize_tree(obj, serialize_updater)

    def prepare(self, obj, spec):
        findings = Findings(f"the {type(obj).__name__}")
        targets = check_updater(obj, probe(obj, serialize_updater), spec, findings)
        findings.raise_if_any(HINT)
        return targets

    def restore(self, obj, tree):
        restore_with(obj, tree, serialize_updater, f"the {type(obj).__name__}")

