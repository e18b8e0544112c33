"""Child process for the crash test: saves forever; prints each committed step."""
import sys

import numpy as np

import uckpt

root = sys.argv[1]
mgr = uckpt.CheckpointManager(root, keep_last=3)
step = (mgr.latest_step() or 0) + 1
print("ready", flush=True)
while True:
    state = {"a": np.full((512, 1024), step, np.float32), "b": np.full(300_000, -step, np.int64),
             "small": {"x": np.arange(10) * step}, "step": step}
    mgr.save(step, state)
    print("committed", step, flush=True)
    step += 1
