"""Child process for the preemption test: a training loop that saves every 100 steps
and on SIGTERM/SIGUSR1 (then exits 0); resumes from the newest checkpoint."""
import sys
import time

import numpy as np

import uckpt

fast, durable, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
np.random.seed(0)  # a fresh run; a resumed one gets its RNG state from the checkpoint
w = np.zeros(100_000, np.float64)
state = {"w": w, "step": 0, "rng": uckpt.RandomState()}
policy = uckpt.EveryNSteps(100) | uckpt.OnSignal()
with uckpt.CheckpointManager(tiers=[fast, durable], save_policy=policy, async_save=True) as mgr:
    start = mgr.restore(state) or 0
    print("resumed from", start, flush=True)
    for step in range(start + 1, total + 1):
        w += np.random.standard_normal(w.shape)  # depends on the restored RNG
        time.sleep(0.01)
        state["step"] = step
        print("step", step, flush=True)
        if mgr.should_save(step):
            mgr.save(step, state)
print("finished", total, float(w.sum()), flush=True)
