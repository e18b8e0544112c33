"""The callback's logic, shared by the Keras 3 and the tf_keras (Keras 2) callbacks
(:mod:`uckpt_tf.callback`, :mod:`uckpt_tf.callback_keras2`), which differ only in their
base class; what it does is described in :mod:`uckpt_tf.callback`."""
from __future__ import annotations

import numbers
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import uckpt
from uckpt.errors import CorruptCheckpointError, UckptError


RESERVED = ("model", "optimizer", "rng", "epoch", "batch", "step")


class CheckpointLogic:
    """Save ``model.fit``'s complete training state through a :class:`uckpt.CheckpointManager`.

    The callback without its Keras base class: :class:`Checkpoint` adds Keras 3's,
    :class:`uckpt_tf.callback_keras2.Checkpoint` tf_keras's.

    manager
        where and how checkpoints go (tiers, retention, async saves, policies).
    every_n_steps / every_n_epochs
        save after every n-th batch (counted over the whole run) / at the end
        of every n-th epoch. With neither, every epoch.
    state
        more entries for the checkpoint: a mapping, or a callable returning one
        (called at every save and restore), e.g. ``{"schedule": my_stateful}``.
        Its keys must not be one of ``model``, ``optimizer``, ``rng``, ``epoch``,
        ``batch``, ``step``.
    """

    def __init__(self, manager: "uckpt.CheckpointManager", every_n_steps: Optional[int] = None,
                 every_n_epochs: Optional[int] = None,
                 state: Union[None, Mapping[str, Any], Callable[[], Mapping[str, Any]]] = None):
        super().__init__()
        for name, value in (("every_n_steps", every_n_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if every_n_steps is None and every_n_epochs is None:
            every_n_epochs = 1
        self.manager = manager
        self.every_n_steps = every_n_steps
        self.every_n_epochs = every_n_epochs
        self.extra = state
        #: epochs completed, batches done in the current epoch, batches done in all
        self.epoch = 0
        self.batch = 0
        self.step = 0
        self._last_saved: Optional[int] = None
        self._last_saved_batch = 0  # the batch (0: an epoch's end) the last save recorded
        #: the newest step that was there before the restart and was not restored (see
        #: restore): the resumed run saves no step up to it again
        self._kept_until: Optional[int] = None
        #: what the last ``restore`` loaded for the entries of ``state`` (plain values)
        self.restored: Dict[str, Any] = {}

    # -- the checkpoint's content --------------------------------------------------------
    def state(self, model: Optional[Any] = None) -> Dict[str, Any]:
        """The mapping saved and restored (see the module docstring)."""
        model = model if model is not None else self._model_or_none()
        if model is None:
            raise ValueError("no model: pass it (cb.restore(model)) or use the callback in fit")
        out: Dict[str, Any] = {"model": model}
        if getattr(model, "optimizer", None) is not None:
            out["optimizer"] = model.optimizer
        rng = uckpt.RandomState()
        epoch, batch = self._position()
        out.update({"rng": uckpt.PerRank(rng) if self._distributed() else rng,
                    "epoch": epoch, "batch": batch, "step": self.step})
        extra = self.extra() if callable(self.extra) else self.extra
        if extra:
            clash = sorted(set(extra) & set(RESERVED))
            if clash:
                raise ValueError(f"state entries {clash} clash with the callback's own "
                                 f"{list(RESERVED)}; rename them")
            out.update(extra)
        return out

    def _position(self) -> Tuple[int, int]:
        """(epochs completed, batches done in the current epoch) as a checkpoint records
        them: after an epoch's last batch (``steps`` of ``fit``'s params) the epoch is
        complete, so a step save there is that epoch's end, as ``on_epoch_end`` would save it
        (``restore(at_epoch_end=True)`` takes it, and ``fit`` resumes at the next epoch)."""
        steps = (getattr(self, "params", None) or {}).get("steps")
        if self.batch and self.batch == steps:
            return self.epoch + 1, 0
        return self.epoch, self.batch

    def _distributed(self) -> bool:
        return self.manager.comm.size > 1

    def _model_or_none(self):
        try:
            return self.model
        except (AttributeError, ValueError):
            return None

    # -- resume ----------------------------------------------------------------------------
    def restore(self, model: Optional[Any] = None, *, step: Optional[int] = None,
                at_epoch_end: bool = False) -> int:
        """Restore the newest checkpoint (or ``step``) into ``model``; return the initial epoch.

        Returns 0 and changes nothing when there is no checkpoint. With
        ``at_epoch_end``, the newest checkpoint saved at the end of an epoch.
        With several ranks this is collective, like ``manager.restore``.
        """
        prepared: Dict[str, Any] = {}

        def prepare() -> Tuple[List[int], List[int]]:
            # what can fail on one rank only: raised on every rank (below) when distributed
            prepared["state"] = self.state(model)
            self.manager.wait()
            steps = list(reversed(self.manager.steps()))
            if step is not None:
                return steps, [step]
            if at_epoch_end:
                return steps, [s for s in steps if self._at_epoch_end(s)]
            return steps, steps

        if self._distributed():
            # every rank must try the same steps in the same order (ranks may see different
            # steps, e.g. on node-local storage): those that every rank sees, newest first
            views = self.manager.comm.gather_outcomes(prepare, "Keras checkpoint restore")
            present = set(views[0][0]).intersection(*(set(v[0]) for v in views[1:]))
            common = set(views[0][1]).intersection(*(set(v[1]) for v in views[1:]))
            candidates = [s for s in views[0][1] if s in common]
        else:
            steps, candidates = prepare()
            present = set(steps)
        state = prepared["state"]
        if at_epoch_end and step is None and not candidates and self.manager.steps():
            warnings.warn("uckpt: no checkpoint was saved at the end of an epoch; nothing "
                          "restored, training starts from scratch", UserWarning, stacklevel=2)
        restored = None
        for i, s in enumerate(candidates):
            try:
                restored = self._restore_step(state, s)
                break
            except CorruptCheckpointError:
                if i == len(candidates) - 1:
                    raise
                warnings.warn(f"uckpt: checkpoint step {s} is damaged; trying an older one",
                              RuntimeWarning, stacklevel=2)
        if restored is None:
            # training starts from scratch beside checkpoints it did not take (none at an
            # epoch's end): kept as they are, the run does not save those steps again
            self._kept_until = max(present, default=None)
            return 0
        self.epoch, self.batch, self.step = (int(state["epoch"]), int(state["batch"]),
                                             int(state["step"]))
        self._last_saved, self._last_saved_batch = self.step, self.batch
        # checkpoints newer than the one restored (at_epoch_end, step=, a damaged newer one):
        # kept as they are, the resumed run saves no step up to the newest of them again
        # (the manager refuses a step below its newest: StepOrderError)
        self._kept_until = max((s for s in present if s > self.step), default=None)
        self.restored = {k: v for k, v in state.items() if k not in RESERVED}
        if self.batch:
            warnings.warn(
                f"uckpt: restored checkpoint step {self.step}, saved after batch {self.batch} of "
                f"epoch {self.epoch}; model.fit cannot start mid-epoch, so epoch {self.epoch} "
                f"starts over from its first batch (its first {self.batch} batches are trained "
                "twice). restore(at_epoch_end=True) resumes exactly from the newest "
                "end-of-epoch checkpoint instead.", UserWarning, stacklevel=2)
        return self.epoch

    def _restore_step(self, state: Dict[str, Any], step: int) -> Optional[int]:
        """``manager.restore`` of ``step``, with ``rng`` in the form the checkpoint has it.

        A checkpoint saved by several ranks holds each rank's random state (PerRank);
        one saved by a single process holds one. Any job restores either: a rank
        restores its own random state where the checkpoint has one for it, the single
        one where there is only that, and none (a warning) where the job grew.
        """
        try:
            node = self.manager.manifest(step).tree["items"].get("rng")
        except UckptError:
            node = None
        # in place: manager.restore writes the plain values (epoch, step...) back into state
        rng = uckpt.RandomState()
        state["rng"] = uckpt.PerRank(rng) if self._distributed() else rng
        strict = True
        if node is not None:
            rank = self.manager.comm.rank
            if node.get("type") == "dict" and node.get("key_type") == "int":
                if str(rank) in node.get("items", {}):
                    state["rng"] = uckpt.PerRank(rng)
                else:
                    del state["rng"]
                    strict = False  # the checkpoint's rng (other ranks') stays unread
                    warnings.warn(
                        f"uckpt: checkpoint step {step} holds the random state of ranks "
                        f"{', '.join(sorted(node.get('items', {}), key=int))}, not of rank "
                        f"{rank}; this rank's global random generators are not restored",
                        UserWarning, stacklevel=3)
            else:
                state["rng"] = rng
        return self.manager.restore(state, step=step, strict=strict)

    def _at_epoch_end(self, step: int) -> bool:
        try:
            meta = self.manager.manifest(step).metadata
        except UckptError:
            return False
        return meta.get("keras", {}).get("batch") == 0

    # -- Keras hooks -------------------------------------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.batch = 0

    def on_train_batch_end(self, batch, logs=None):
        before = self.step
        # with steps_per_execution > 1, Keras passes the index of the last batch it ran
        self.step += batch + 1 - self.batch
        self.batch = batch + 1
        steps_due = self.every_n_steps is not None and \
            self.step // self.every_n_steps > before // self.every_n_steps
        # asked at every batch, on every rank: with several ranks this is collective (the
        # ranks agree to save, and to exit after the save, if any rank's policy says so)
        policy_due = self.manager.should_save(self.step)
        if not (steps_due or policy_due):
            return
        if self.batch == (self.params or {}).get("steps") and self._epoch_save_due(self.epoch):
            return  # the last batch of an epoch that is saved at its end anyway
        self._save()

    def on_epoch_end(self, epoch, logs=None):
        # a step save after this epoch's last batch recorded it mid-epoch when fit did not
        # know the epoch's length (no ``steps``): saved again as the epoch's end
        relabel = self._last_saved == self.step and self._last_saved_batch != 0
        self.epoch = epoch + 1
        self.batch = 0
        if self._epoch_save_due(epoch) or relabel:
            metrics = {k: float(v) for k, v in (logs or {}).items()
                       if isinstance(v, numbers.Real) and not isinstance(v, bool)}
            if self._distributed():
                # each rank's logs are its own unless averaged; the manifest (one per view
                # of the directory) and retention (KeepBest) must not depend on the rank
                metrics = self.manager.comm.broadcast(metrics, root=0)
            self._save(metrics=metrics)

    def on_train_end(self, logs=None):
        self.manager.wait()  # raise a background save's error here, not after fit returned

    def _epoch_save_due(self, epoch: int) -> bool:
        return self.every_n_epochs is not None and (epoch + 1) % self.every_n_epochs == 0

    def _save(self, metrics: Optional[Dict[str, float]] = None) -> None:
        if self._kept_until is not None and self.step <= self._kept_until:
            warnings.warn(f"uckpt: step {self.step} is not saved: step {self._kept_until} "
                          "exists from before the restart (newer than the checkpoint "
                          "restored) and is kept as it was", UserWarning, stacklevel=3)
            return
        overwrite = self._last_saved == self.step  # e.g. a step save on an epoch's last batch
        epoch, batch = self._position()
        self.manager.save(self.step, self.state(),
                          metadata={"keras": {"epoch": epoch, "batch": batch,
                                              "step": self.step}},
                          metrics=metrics or None, overwrite=overwrite)
        self._last_saved, self._last_saved_batch = self.step, batch
