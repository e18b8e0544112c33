"""The CPU priority of uckpt's background threads (``knobs.background_nice``)."""
from __future__ import annotations

import os
import threading

from .. import knobs


def lower_priority() -> None:
    """Make this thread (and the threads it starts, which inherit it) yield to training."""
    if knobs.background_nice > 0 and hasattr(os, "setpriority"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) +
                           knobs.background_nice)
        except OSError:
            pass  # best effort
