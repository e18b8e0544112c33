"""The :class:`~uckpt.CheckpointManager`'s settings, grouped into option objects.

``CheckpointManager(root, save_options=SaveOptions(...), retention=RetentionOptions(...),
async_save=AsyncOptions(...), incremental=IncrementalOptions(...))``; the older flat
keywords (``keep_last``, ``keep``, ``durable_every``, ``max_inflight``, ``late_snapshot``,
``compression``, ``compression_level``, ``full_every``, ``reverify_every``) stay as
shorthands that :func:`manager_options` turns into the same objects. A shorthand and
the object it belongs to given together are refused
(:class:`~uckpt.errors.OptionsError`, a ``ValueError``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from ..errors import OptionsError
from ..options import SaveOptions, check_count
from ..options import save_options as _save_options
from .policies import as_retention


@dataclass(frozen=True)
class RetentionOptions:
    """``keep``: the default retention of every tier without its own (``Tier(keep=...)``):
    a policy, a list of them, an int n (keep the newest n), or None (keep all; see
    :func:`uckpt.manager.policies.as_retention`). ``durable_every``: copy only every k-th saved
    checkpoint to the durable tiers."""

    keep: Any = None
    durable_every: int = 1

    def __post_init__(self) -> None:
        as_retention(self.keep)  # a bad policy is refused now, not at the first save
        check_count(self, "durable_every", self.durable_every)


@dataclass(frozen=True)
class AsyncOptions:
    """Asynchronous saves: at most ``max_inflight`` snapshots held in host memory;
    ``late_snapshot`` a late-copy guard (:mod:`uckpt.saving.late`, e.g.
    ``uckpt.torch.LateSnapshot(optimizer)``)."""

    max_inflight: int = 1
    late_snapshot: Any = None

    def __post_init__(self) -> None:
        check_count(self, "max_inflight", self.max_inflight)


@dataclass(frozen=True)
class IncrementalOptions:
    """Incremental saves: every ``full_every``-th save writes everything; a base is read
    back again once every ``reverify_every`` saves that refer to it."""

    full_every: int = 10
    reverify_every: int = 10

    def __post_init__(self) -> None:
        check_count(self, "full_every", self.full_every)
        check_count(self, "reverify_every", self.reverify_every)


@dataclass(frozen=True)
class ManagerOptions:
    """Everything a manager was configured with (``async_save`` / ``incremental``: None
    when off)."""

    save: SaveOptions
    retention: RetentionOptions
    async_save: Optional[AsyncOptions]
    incremental: Optional[IncrementalOptions]


def _one_of(group: str, given: Any, **shorthands: Any) -> None:
    named = [k for k, v in shorthands.items() if v is not None]
    if given is not None and named:
        raise OptionsError(
            f"CheckpointManager: {', '.join(named)} given both as a keyword and in {group}",
            hint=f"put {', '.join(named)} inside {group}(...) only")


def manager_options(*, save_options: Optional[SaveOptions] = None,
                    retention: Optional[RetentionOptions] = None,
                    keep_last: Optional[int] = None, keep: Any = None,
                    durable_every: Optional[int] = None,
                    async_save: Union[bool, AsyncOptions] = False,
                    max_inflight: Optional[int] = None, late_snapshot: Any = None,
                    compression: Any = None, compression_level: Optional[int] = None,
                    incremental: Union[bool, IncrementalOptions] = False,
                    full_every: Optional[int] = None, reverify_every: Optional[int] = None,
                    concurrent_writers: bool = False) -> ManagerOptions:
    """The :class:`ManagerOptions` of a manager's keywords (see the module docstring)."""
    if keep_last is not None and keep is not None:
        raise OptionsError("give keep_last or keep, not both",
                           hint="keep_last=n is keep=n; keep also takes policies")
    if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
        raise OptionsError(f"keep_last must be a positive int or None, got {keep_last!r}",
                           hint="keep_last=n keeps the newest n checkpoints")
    _one_of("RetentionOptions", retention, keep_last=keep_last, keep=keep,
            durable_every=durable_every)
    if retention is None:
        retention = RetentionOptions(keep if keep is not None else keep_last,
                                     1 if durable_every is None else durable_every)
    given_async = async_save if isinstance(async_save, AsyncOptions) else None
    _one_of("AsyncOptions", given_async, max_inflight=max_inflight,
            late_snapshot=late_snapshot)
    if late_snapshot is not None and not async_save:
        raise OptionsError("late_snapshot defers the copies of an asynchronous save: give "
                           "async_save=True too (a synchronous save writes from live memory)",
                           hint="CheckpointManager(..., async_save=True, late_snapshot=...)")
    shorthand = AsyncOptions(1 if max_inflight is None else max_inflight, late_snapshot)
    run_async = given_async or (shorthand if async_save else None)
    given_chain = incremental if isinstance(incremental, IncrementalOptions) else None
    _one_of("IncrementalOptions", given_chain, full_every=full_every,
            reverify_every=reverify_every)
    # made (so checked) even where saves are full and it goes unused
    shorthand_chain = IncrementalOptions(10 if full_every is None else full_every,
                                         10 if reverify_every is None else reverify_every)
    chain = (given_chain or shorthand_chain) if incremental else None
    if chain is not None and concurrent_writers:
        raise OptionsError("incremental saves need an exclusive writer: another writer's "
                           "retention could delete the checkpoints this one refers to",
                           hint="drop concurrent_writers=True, or save in full")
    return ManagerOptions(
        _save_options(save_options, compression, compression_level, "CheckpointManager"),
        retention, run_async, chain)
