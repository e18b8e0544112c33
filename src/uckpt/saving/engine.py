"""Background saving: snapshot now, write later, never lose an error.

``AsyncSaver.submit`` blocks only for the snapshot (waiting first for a staging
slot when ``max_inflight`` snapshots are already in flight), then runs the job
on a background thread. Jobs run one after another in submission order. Each
job runs on its own non-daemon thread, so a normal interpreter exit waits for
in-flight saves to finish; a crash leaves only an invisible temporary
directory.
"""
from __future__ import annotations

import atexit
import logging
import threading
from typing import Any, Callable, Optional

from .staging import Snapshot, StagingPool, snapshot
from ..tree.flatten import FlatState
from ..runtime.priority import lower_priority

log = logging.getLogger("uckpt.saving.engine")


class SaveHandle:
    """The result of a save that may still be running.

    ``done()`` says whether it finished; ``wait()`` / ``result()`` block until it
    did and return the checkpoint's path, or raise the error it failed with
    (the original exception, with its traceback from the background thread).
    """

    def __init__(self, description: str) -> None:
        self.description = description
        self._event = threading.Event()
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self.reported = False  # set once the error (if any) reached the caller

    def _finish(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        self._value, self._error = value, error
        if error is not None and hasattr(error, "add_note"):
            error.add_note(f"uckpt: raised by the background {self.description}")
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        if not self._event.wait(timeout):
            raise TimeoutError(f"{self.description} still running after {timeout} s")
        self.reported = True
        return self._error

    def unreported_error(self) -> Optional[BaseException]:
        """The error of a finished save that nobody has looked at yet (marks it seen)."""
        if self._event.is_set() and self._error is not None and not self.reported:
            self.reported = True
            return self._error
        return None

    def wait(self, timeout: Optional[float] = None) -> Any:
        error = self.exception(timeout)
        if error is not None:
            raise error
        return self._value

    result = wait

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        if self.done() and self._error is not None:
            state = f"failed: {type(self._error).__name__}"
        return f"<SaveHandle {self.description}: {state}>"


class SerialRunner:
    """Runs jobs on background non-daemon threads, strictly one after another (each
    job's thread first joins the previous one's), in submission order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._last: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def run(self, handle: SaveHandle, job: Callable[[], Any],
            cleanup: Optional[Callable[[], None]] = None) -> SaveHandle:
        with self._lock:
            previous = self._last

            def body() -> None:
                lower_priority()
                if previous is not None:
                    previous.join()
                try:
                    handle._finish(job())
                except BaseException as e:  # noqa: BLE001 - handed to the caller via the handle
                    handle._finish(error=e)
                finally:
                    if cleanup is not None:
                        cleanup()

            thread = threading.Thread(target=body, name=f"{self.name}", daemon=False)
            thread.start()
            self._last = thread
        return handle

    def join(self) -> None:
        with self._lock:
            last = self._last
        if last is not None:
            last.join()


class AsyncSaver:
    """Snapshots into a bounded staging pool; writes on a background :class:`SerialRunner`.

    Keeps the handles of its saves until their outcome is seen:
    ``raise_unreported`` raises the first error nobody has looked at.
    """

    def __init__(self, max_inflight: int = 1, name: str = "uckpt-save") -> None:
        self.pool = StagingPool(max_inflight)
        self.runner = SerialRunner(name)
        self._handles: list = []
        self._lock = threading.Lock()

    def submit(self, flat: FlatState, job: Callable[[Snapshot], Any], description: str,
               make_snapshot: Optional[Callable[[StagingPool], Snapshot]] = None) -> SaveHandle:
        """Snapshot ``flat`` and run ``job(snapshot)`` on the background runner;
        ``make_snapshot(pool)``, if given, makes the snapshot (default: every array of
        ``flat``)."""
        snap: Snapshot = make_snapshot(self.pool) if make_snapshot else \
            snapshot(flat, self.pool)  # the only blocking part
        handle = self.runner.run(SaveHandle(description), lambda: job(snap.ready()), snap.release)
        with self._lock:
            self._handles = [h for h in self._handles if not (h.done() and h.reported)]
            self._handles.append(handle)
        return handle

    def run(self, job: Callable[[], Any], description: str) -> SaveHandle:
        """Run ``job`` on the background runner, after the saves before it (no snapshot)."""
        handle = self.runner.run(SaveHandle(description), job)
        with self._lock:
            self._handles.append(handle)
        return handle

    def raise_unreported(self) -> None:
        with self._lock:
            handles = list(self._handles)
        for h in handles:
            error = h.unreported_error()
            if error is not None:
                raise error

    def join(self) -> None:
        self.runner.join()


def submit_collective(saver: AsyncSaver, flat: "FlatState | BaseException",
                      job: Callable[[Any], Any], description: str,
                      make_snapshot: Optional[Callable[[StagingPool], Snapshot]] = None
                      ) -> SaveHandle:
    """Submit a save whose background job is collective (every rank runs it, in order).

    If this rank cannot take part (``flat`` is the error it failed with before
    the save, or the snapshot fails), the job still runs in the background with
    the error, so that the other ranks learn it instead of waiting for this
    one; the error is then raised here.
    """
    error: BaseException
    if isinstance(flat, BaseException):
        error = flat
    else:
        try:
            return saver.submit(flat, job, description, make_snapshot)
        except Exception as e:  # noqa: BLE001 - told to the other ranks, raised below
            error = e
    saver.run(lambda: job(error), description).reported = True
    raise error


_default: Optional[AsyncSaver] = None
_default_lock = threading.Lock()


def default_saver() -> AsyncSaver:
    """The saver behind ``uckpt.save(..., blocking=False)`` (one staging slot)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = AsyncSaver(1, "uckpt-save-default")
            atexit.register(_report_default)
        return _default


def _report_default() -> None:
    """At exit (background threads are joined by then), print an error nobody saw."""
    if _default is None:
        return
    try:
        _default.raise_unreported()
    except BaseException as e:  # noqa: BLE001 - nobody is left to raise it to
        log.error("uckpt: a background save failed and was never reported: %s: %s",
                  type(e).__name__, e)
