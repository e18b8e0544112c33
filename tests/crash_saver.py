"""Child process for the crash tests: saves forever; prints each committed step.

    crash_saver.py ROOT                       synchronous saves under ROOT
    crash_saver.py FAST DURABLE --async       async saves, copied to a durable tier
    crash_saver.py ROOT --incremental         incremental saves (a few rows change each
                                              step), keep_last=2, a full save every 3
"""
import sys

import numpy as np

import uckpt

args = [a for a in sys.argv[1:] if not a.startswith("--")]
asynchronous = "--async" in sys.argv
incremental = "--incremental" in sys.argv
if incremental:
    import incremental_common

    mgr = uckpt.CheckpointManager(args[0], keep_last=2, incremental=True, full_every=3)
elif len(args) == 1:
    mgr = uckpt.CheckpointManager(args[0], keep_last=3, async_save=asynchronous)
else:
    mgr = uckpt.CheckpointManager(tiers=[uckpt.Tier(args[0], keep=2), uckpt.Tier(args[1], keep=3)],
                                  async_save=asynchronous, max_inflight=2)
step = (mgr.latest_step() or 0) + 1
print("ready", flush=True)
pending = []
while True:
    state = incremental_common.state(step) if incremental else \
        {"a": np.full((512, 1024), step, np.float32), "b": np.full(300_000, -step, np.int64),
         "small": {"x": np.arange(10) * step}, "step": step}
    result = mgr.save(step, state)
    pending.append((step, result))
    for s, r in list(pending):  # report what is committed on the first tier
        if not isinstance(r, uckpt.SaveHandle) or r.done():
            if isinstance(r, uckpt.SaveHandle):
                r.wait()
            print("committed", s, flush=True)
            pending.remove((s, r))
    step += 1
