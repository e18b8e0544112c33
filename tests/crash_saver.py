"""Child process for the crash tests: saves forever; prints each committed step.

    crash_saver.py ROOT                       synchronous saves under ROOT
    crash_saver.py FAST DURABLE --async       async saves, copied to a durable tier
    crash_saver.py ROOT --incremental         incremental saves (a few rows change each
                                              step), keep_last=2, a full save every 3
    crash_saver.py ROOT --bitrot              incremental saves, keep_last=6, bases re-read
                                              every 2 saves; after every 4th save a bit of a
                                              chunk it refers to is flipped ("damaging BASE
                                              FILE OFFSET", printed first); prints each
                                              damage found ("detected BASE FILE OFFSET
                                              [STEPS]") and each save refused for
                                              referring to it ("refused STEP"), then
                                              saved again in full
    crash_saver.py ROOT --rollback            keep_last=3; now and then restores an earlier
                                              step and continues from it on a new line:
                                              ``rollback()``, or ``on_rollback="archive"``
                                              (prints "rollback N LINE" before, "rolledback N
                                              LINE" after, "committed STEP LINE" per save)
"""
import logging
import os
import random
import re
import sys

import numpy as np

import uckpt


def say(*words) -> None:
    """One line to stdout in one write (the verifier's thread prints too)."""
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


args = [a for a in sys.argv[1:] if not a.startswith("--")]
#: several chunks per array, so a kill can tear an array's chunks apart
LAYOUT = uckpt.SaveOptions(chunk_bytes=256 << 10, incremental_chunk_bytes=8 << 10)
asynchronous = "--async" in sys.argv
bitrot = "--bitrot" in sys.argv
incremental = "--incremental" in sys.argv or bitrot
if "--rollback" in sys.argv:
    import rollback_saver

    rollback_saver.run(args[0], LAYOUT)
if bitrot:
    import incremental_common

    class Detected(logging.Handler):
        def emit(self, record):
            redo = re.search(r"step_(\d+) was committed referring to", record.getMessage())
            if redo:  # saved again in full: not reported as committed before that is done
                say("refused", int(redo.group(1)))
                return
            found = re.search(r"damaged data in .*?/(step_\d+)/(data-\d+\.bin): .*? byte offset "
                              r"(\d+) .*refer to it \(they may not restore\): (.*?);",
                              record.getMessage())
            say("detected", *found.groups()[:3], found.group(4).replace(" ", ""))

    logging.getLogger("uckpt.saving.reverify").addHandler(Detected(logging.WARNING))
    logging.getLogger("uckpt.saving.collective").addHandler(Detected(logging.WARNING))
    mgr = uckpt.CheckpointManager(args[0], keep_last=6, incremental=True, reverify_every=2,
                                  save_options=LAYOUT)
elif incremental:
    import incremental_common

    mgr = uckpt.CheckpointManager(args[0], keep_last=2, incremental=True, full_every=3,
                                  save_options=LAYOUT)
elif len(args) == 1:
    mgr = uckpt.CheckpointManager(args[0], keep_last=3, async_save=asynchronous,
                                  save_options=LAYOUT)
else:
    mgr = uckpt.CheckpointManager(tiers=[uckpt.Tier(args[0], keep=2), uckpt.Tier(args[1], keep=3)],
                                  async_save=asynchronous, max_inflight=2,
                                  save_options=LAYOUT)
step = (mgr.latest_step() or 0) + 1
rot = random.Random(step)
say("ready")
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
            say("committed", s)
            pending.remove((s, r))
    if bitrot and step % 4 == 0:  # bit rot in a base this step refers to
        referred = [c for c in mgr.manifest(step).arrays["table"].chunks if c.base]
        if referred:
            c = rot.choice(referred)
            say("damaging", c.base, c.file, c.offset)  # first: a kill may follow
            fd = os.open(os.path.join(args[0], c.base, c.file), os.O_RDWR)
            at = c.offset + rot.randrange(c.length)
            os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ (1 << rot.randrange(8))]), at)
            os.fsync(fd)
            os.close(fd)
    step += 1
