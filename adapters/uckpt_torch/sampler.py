"""``ResumableSampler``: a shuffling ``Sampler`` whose place in the data order is checkpointed.

The data order of epoch ``e`` is a pure function of ``(seed + e, dataset
length, num_replicas, rank, shuffle, drop_last)``: the permutation is
``torch.randperm(n, generator=torch.Generator().manual_seed(seed + e))``, padded
or cut and split across replicas exactly as ``torch.utils.data.DistributedSampler``
does, so for the same arguments both give the same indices. A checkpoint therefore
needs no generator state, only where the run is: ``epoch`` and ``position`` (how
many of this replica's samples of the epoch are consumed), plus the arguments,
which ``load_state_dict`` checks.

When a sample counts as consumed (``advance``):

* ``"auto"`` (default): when the sampler hands its index out. With
  ``num_workers=0`` a ``DataLoader`` draws the indices of one batch per
  ``next()``, so between two steps ``position`` is exactly the number of samples
  of the batches the loop has received. With ``num_workers > 0`` the loader
  draws ``prefetch_factor * num_workers`` batches ahead, and ``position`` counts
  those too: a restart would skip them.
* ``"manual"``: only when the loop calls ``advance(n)`` after using ``n``
  samples. Exact with any number of workers.

The epoch ends when ``position`` reaches ``len(sampler)`` (the next sample comes
from epoch ``epoch + 1``, position 0), or, in manual mode, when an iteration
ran out without every sample being advanced (the loader dropped a last partial
batch) and the sampler is iterated again. ``set_epoch(e)`` starts epoch ``e``
from its beginning, unless the sampler is in epoch ``e`` already (as after a
restore), in which case it keeps its position.

Give the ``DataLoader`` its own ``generator=torch.Generator()``: every
``iter(loader)`` draws a seed for its workers from it (even with
``num_workers=0``), by default from torch's global RNG, and a resumed run
starts an iterator mid-epoch where the uninterrupted one did not.

``SamplerAdapter`` (an adapter): ``extract`` returns ``state_dict()`` (plain
ints and bools, no arrays); ``prepare`` checks that state against the sampler
and raises before anything is read; ``restore`` calls ``load_state_dict``.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch.utils.data import Sampler

from uckpt.adapter import Adapter
from uckpt.errors import KeyMismatchError, StateMismatchError

_INTS = ("epoch", "position", "seed", "dataset_length", "num_replicas")
_BOOLS = ("shuffle", "drop_last")
_MUST_MATCH = ("dataset_length", "num_replicas", "shuffle", "drop_last")


class ResumableSampler(Sampler[int]):
    """Shuffled indices, epoch after epoch, that resume at the same sample after a restore.

    ``data_source_or_len`` is the data set (only its ``len()`` is used, once) or
    its length. ``num_replicas`` / ``rank`` split every epoch across
    data-parallel processes as ``DistributedSampler`` does (default: the
    initialized ``torch.distributed`` group, else one replica); ``drop_last``
    cuts the tail instead of padding it. ``advance`` says when a sample counts
    as consumed (see the module docstring): ``"auto"`` when handed out,
    ``"manual"`` when the loop calls :meth:`advance`.

    Put the sampler itself in the state given to ``uckpt.save`` /
    ``CheckpointManager.save``; a restore puts it back in place. The state is
    the same on every rank, so any rank's checkpoint resumes every rank.
    """

    def __init__(self, data_source_or_len: Any, *, shuffle: bool = True, seed: int = 0,
                 num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 drop_last: bool = False, advance: str = "auto") -> None:
        super().__init__()
        length = _length(data_source_or_len)
        num_replicas, rank = _replicas(num_replicas, rank)
        if advance not in ("auto", "manual"):
            raise ValueError(f"advance must be 'auto' or 'manual', not {advance!r}")
        if drop_last:
            num_samples = length // num_replicas
        else:
            num_samples = math.ceil(length / num_replicas)
        if num_samples == 0:
            raise ValueError(f"{length} samples leave no sample per replica for "
                             f"{num_replicas} replicas with drop_last=True")
        self.dataset_length = length
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.advance_mode = advance
        self.num_samples = num_samples                  # per replica and epoch
        self.total_size = num_samples * num_replicas
        self.seed = _int(seed, "seed")
        self._epoch = 0
        self._position = 0
        self._generation = 0        # bumped on every jump; older iterators stop counting
        self._ran_out = False       # manual: an iteration of this epoch ran out
        self._cache: Optional[tuple] = None

    # -- where the run is -------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next sample comes from."""
        return self._epoch

    @property
    def position(self) -> int:
        """How many of this replica's samples of ``epoch`` are consumed."""
        return self._position

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; a no-op if the sampler is in it already."""
        epoch = _int(epoch, "epoch")
        if epoch != self._epoch:
            self._jump(epoch, 0)

    def advance(self, num_samples: int) -> None:
        """Count ``num_samples`` more samples as consumed (``advance="manual"`` only)."""
        if self.advance_mode != "manual":
            raise RuntimeError("advance() is for a sampler created with advance='manual'; "
                               "this one counts each index as it hands it out")
        n = _int(num_samples, "num_samples")
        if n < 0 or self._position + n > self.num_samples:
            raise ValueError(f"advance({n}) at position {self._position} leaves epoch "
                             f"{self._epoch} (0 to {self.num_samples} samples per replica)")
        self._count(n)

    # -- the data order ---------------------------------------------------------------------
    def indices(self, epoch: int) -> List[int]:
        """This replica's indices for ``epoch``, in order (the same as ``DistributedSampler``'s)."""
        return list(self._order(_int(epoch, "epoch")))

    def _order(self, epoch: int) -> List[int]:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        n = self.dataset_length
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        if self.drop_last:
            order = order[:self.total_size]
        else:
            pad = self.total_size - n
            order += (order * math.ceil(pad / n))[:pad]
        order = order[self.rank:self.total_size:self.num_replicas]
        self._cache = (epoch, order)
        return order

    def __iter__(self) -> Iterator[int]:
        if self._ran_out:
            self._jump(self._epoch + 1, 0)
        return self._iterate(self._generation, self._order(self._epoch), self._position)

    def _iterate(self, generation: int, order: List[int], start: int) -> Iterator[int]:
        auto = self.advance_mode == "auto"
        for i in range(start, len(order)):
            if auto and generation == self._generation:
                self._count(1)      # counted as it is handed out; may start the next epoch
            yield order[i]
        if generation == self._generation:
            self._ran_out = True    # manual only: auto has moved on to the next epoch

    def _count(self, n: int) -> None:
        self._position += n
        if self._position >= self.num_samples:
            self._jump(self._epoch + 1, 0)

    def _jump(self, epoch: int, position: int) -> None:
        self._epoch, self._position = epoch, position
        self._generation += 1
        self._ran_out = False

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Plain ints and bools: where the run is, and what the data order follows from."""
        return {"epoch": self._epoch, "position": self._position, "seed": self.seed,
                "shuffle": self.shuffle, "dataset_length": self.dataset_length,
                "num_replicas": self.num_replicas, "drop_last": self.drop_last}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state``; StateMismatchError if it does not fit this sampler.

        The checkpoint's ``seed`` replaces this sampler's (it defines the data
        order being resumed); the data set length, ``num_replicas``,
        ``shuffle`` and ``drop_last`` must match.
        """
        self.check_state(state)
        self.seed = int(state["seed"])
        self._cache = None
        epoch, position = int(state["epoch"]), int(state["position"])
        if position == self.num_samples:
            epoch, position = epoch + 1, 0
        self._jump(epoch, position)

    def check_state(self, state: Any) -> None:
        """Raise StateMismatchError (listing every problem) unless ``state`` fits this sampler."""
        what = f"the ResumableSampler over {self.dataset_length} samples"
        if not isinstance(state, dict):
            raise StateMismatchError(f"{what}: the checkpoint holds a {type(state).__name__}, "
                                     "not a sampler state")
        expected = set(_INTS + _BOOLS)
        if set(state) != expected:
            raise KeyMismatchError(what, missing=expected - set(state),
                                   unexpected=set(state) - expected)
        problems = []
        for key in _INTS:
            if not _is_int(state[key]):
                problems.append(f"{key}: {state[key]!r} in the checkpoint is not an integer")
        for key in _BOOLS:
            if not isinstance(state[key], bool):
                problems.append(f"{key}: {state[key]!r} in the checkpoint is not a bool")
        if problems:
            raise StateMismatchError("\n".join([f"{what} does not match the checkpoint"]
                                               + [f"  {p}" for p in problems]))
        mine = self.state_dict()
        for key in _MUST_MATCH:
            if state[key] != mine[key]:
                problems.append(f"{key}: {state[key]!r} in the checkpoint, {mine[key]!r} "
                                "in the sampler")
        if not problems and not 0 <= state["position"] <= self.num_samples:
            problems.append(f"position: {state['position']} in the checkpoint, outside an "
                            f"epoch of {self.num_samples} samples per replica")
        if not problems and state["epoch"] < 0:
            problems.append(f"epoch: {state['epoch']} in the checkpoint is negative")
        if problems:
            raise StateMismatchError(
                "\n".join([f"{what} does not match the checkpoint"] + [f"  {p}" for p in problems]),
                hint="create the sampler over the same data set, with the num_replicas, shuffle "
                     "and drop_last of the run that saved it")

    def __repr__(self) -> str:
        return (f"ResumableSampler({self.dataset_length}, shuffle={self.shuffle}, "
                f"seed={self.seed}, num_replicas={self.num_replicas}, rank={self.rank}, "
                f"epoch={self._epoch}, position={self._position})")


class SamplerAdapter(Adapter):
    name = "torch.resumable_sampler"

    def handles(self, obj):
        return isinstance(obj, ResumableSampler)

    def extract(self, obj):
        return obj.state_dict()

    def prepare(self, obj, spec):
        obj.check_state(spec)       # no arrays: the spec is the whole state
        return None

    def restore(self, obj, tree):
        obj.load_state_dict(tree)


def _length(data_source_or_len: Any) -> int:
    if _is_int(data_source_or_len):
        n = int(data_source_or_len)
    else:
        try:
            n = len(data_source_or_len)
        except TypeError:
            raise TypeError("ResumableSampler needs a data set with len() or its length, "
                            f"not a {type(data_source_or_len).__name__}") from None
    if n <= 0:
        raise ValueError(f"ResumableSampler needs at least one sample, got a length of {n}")
    return n


def _replicas(num_replicas: Optional[int], rank: Optional[int]):
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if initialized else 1
    if rank is None:
        if num_replicas == 1:
            rank = 0
        elif initialized:
            rank = dist.get_rank()
        else:
            raise ValueError(f"pass rank with num_replicas={num_replicas} (torch.distributed "
                             "is not initialized)")
    num_replicas, rank = _int(num_replicas, "num_replicas"), _int(rank, "rank")
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} is not in [0, {num_replicas - 1}] "
                         f"(num_replicas={num_replicas})")
    return num_replicas, rank


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int(value: Any, name: str) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    return int(value)
