#!/usr/bin/env python
"""Kill a training run with SIGKILL, resume it from a uckpt checkpoint, and show
that the resumed run is bitwise identical to one never interrupted: PyTorch,
TensorFlow/Keras and Chainer.

    python examples/resume_demo.py                      # all three frameworks
    python examples/resume_demo.py --framework torch    # 60 steps, kill after 37
    python examples/resume_demo.py --framework torch --steps 30 --kill-at 17 --every 5
    python examples/resume_demo.py --framework tensorflow   # custom loop and model.fit
    python examples/resume_demo.py --framework chainer      # custom loop and Trainer

``--steps``, ``--kill-at`` and ``--every`` apply to the PyTorch demo. The
TensorFlow demo is ``demo()`` of tests/tf_resume.py; the Chainer demo
(examples/chainer_demo.py) runs tests/chainer_train.py. With ``--framework all``
a summary table follows, and the exit status is non-zero if any run differs.

The PyTorch demo runs the training in this file (``train``) three times, each in its
own process:

  A. uninterrupted, from step 0 to the end;
  B. from step 0, killed with SIGKILL after step ``--kill-at`` (not a
     checkpoint step, so the steps since the last checkpoint are lost);
  C. started again on B's checkpoint directory: it restores the newest
     checkpoint and trains to the end.

Every run logs each step's loss exactly (``float.hex``). For bitwise equality
the checkpoint must hold everything the next step depends on: the parameters
and BatchNorm statistics, the optimizer's moments and step counts, the
learning-rate schedule, the global RNGs (dropout masks) and the data order
(the ``uckpt.torch.ResumableSampler``'s epoch and position in the epoch; its
seed fixes each epoch's permutation). Leave any of them out of
``checkpoint_state`` and the losses after the restart differ.

``--train-into DIR`` runs the training alone, checkpointing into DIR; run it
again (after Ctrl-C, say) and it resumes.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uckpt

BATCH_SIZE = 128  # 2048 images: 16 batches per epoch, so the default runs cross epochs


# ---------------------------------------------------------------------------------------
# The training run: an ordinary PyTorch loop with uckpt checkpointing.
# ---------------------------------------------------------------------------------------
def checkpoint_state(model, optimizer, scheduler, sampler, step):
    """Everything the next training step depends on."""
    return {
        "model": model,                  # parameters and BatchNorm buffers
        "optimizer": optimizer,          # Adam moments and step counts
        "scheduler": scheduler,          # StepLR position
        "rng": uckpt.RandomState(),      # Python, NumPy and torch global RNGs (dropout)
        "sampler": sampler,              # data order: epoch, position in the epoch, seed
        "step": step,
    }


def train(root, *, steps, every, log=None, lockstep=False):
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from toy_task import SmallCNN, make_dataset, parameters_digest
    from uckpt.torch import ResumableSampler

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)      # fixed reduction order in the CPU kernels
    torch.manual_seed(0)          # initial weights; on resume the checkpoint overrides it

    images, labels = make_dataset()
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    sampler = ResumableSampler(len(images), seed=1)    # shuffles anew every epoch
    # num_workers=0: the loader draws one batch of indices per step, so between steps the
    # sampler's position is exact. generator=: every iter(loader) draws a seed (for
    # workers) from it, by default from torch's global RNG, which would then shift the
    # dropout masks of a resumed run (it starts an iterator mid-epoch).
    loader = DataLoader(TensorDataset(images, labels), batch_size=BATCH_SIZE, sampler=sampler,
                        drop_last=True, generator=torch.Generator())

    with uckpt.CheckpointManager(root, keep_last=3) as manager:
        state = checkpoint_state(model, optimizer, scheduler, sampler, 0)
        step = manager.restore(state)     # newest checkpoint in root, or None
        if step is None:
            step = 0
            print("starting from scratch", flush=True)
        else:                             # the sampler, too, was restored in place
            assert state["step"] == step, "plain values in the state are restored in place"
            print(f"restored checkpoint at step {step} "
                  f"(epoch {sampler.epoch}, batch {sampler.position // BATCH_SIZE})", flush=True)

        batches = endless(loader)
        with open(log or os.devnull, "a") as log_file:
            while step < steps:
                model.train()
                inputs, targets = next(batches)
                loss = F.cross_entropy(model(inputs), targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1

                saved = step % every == 0
                if saved:
                    manager.save(step, checkpoint_state(model, optimizer, scheduler, sampler, step))
                value = loss.item()      # the float32 loss, exactly, as a Python float
                log_file.write(f"{step} {value.hex()}\n")
                log_file.flush()
                print(f"step {step} loss {value:.6f}{'  [checkpoint saved]' if saved else ''}",
                      flush=True)
                # --lockstep: the demo answers each step, so that it can kill us at an exact one
                if lockstep and not sys.stdin.readline():
                    return 1
    print(f"finished: step {step}, parameters sha256 {parameters_digest(model)}", flush=True)
    return 0


def endless(loader):
    """Batches epoch after epoch (the sampler moves on to the next epoch by itself)."""
    while True:
        yield from loader


# ---------------------------------------------------------------------------------------
# The demo: three runs of `train` in child processes, then the comparison.
# ---------------------------------------------------------------------------------------
def child_command(root, log, args, *, lockstep=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--train-into", str(root),
           "--log", str(log), "--steps", str(args.steps), "--every", str(args.every)]
    return cmd + (["--lockstep"] if lockstep else [])


def run_to_end(cmd):
    """Run one training process to completion; return its stdout lines."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        raise SystemExit(f"training process failed with exit code {proc.returncode}: "
                         f"{' '.join(cmd)}")
    return proc.stdout.splitlines()


def run_and_kill(cmd, kill_at):
    """Run one training process step by step and SIGKILL it right after step `kill_at`."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for line in iter(proc.stdout.readline, ""):
            m = re.match(r"step (\d+) ", line)
            if m and int(m.group(1)) == kill_at:
                proc.send_signal(signal.SIGKILL)    # no cleanup, no flush, no goodbye
                break
            if m:
                try:
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
                except BrokenPipeError:         # it died by itself; reported below
                    break
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != -signal.SIGKILL:
        raise SystemExit(f"the run to be interrupted ended by itself (exit code "
                         f"{proc.returncode}) before step {kill_at}")


def read_losses(log):
    """{step: loss as a Python float} from a training log; a later line for a step wins."""
    losses = {}
    for line in Path(log).read_text().splitlines():
        step, hexval = line.split()
        losses[int(step)] = float.fromhex(hexval)
    return losses


def same_bits(x, y):
    return x.hex() == y.hex()     # unlike ==, tells -0.0 from 0.0 and matches NaN with NaN


def digest_from(lines):
    for line in lines:
        m = re.search(r"parameters sha256 ([0-9a-f]+)", line)
        if m:
            return m.group(1)
    raise SystemExit("a training process did not report its final parameters")


def restored_step_from(lines):
    for line in lines:
        m = re.match(r"restored checkpoint at step (\d+)", line)
        if m:
            return int(m.group(1))
        if line.startswith("starting from scratch"):
            return 0
    raise SystemExit("the resumed process did not say where it started")


def checkpoint_steps(root):
    with uckpt.CheckpointManager(root) as manager:
        return list(manager.steps())


def demo(args):
    return 0 if torch_demo(args)["ok"] else 1


def torch_demo(args):
    print(f"uckpt resume demo: {args.steps} training steps, a checkpoint every {args.every} "
          f"(keep_last=3), SIGKILL after step {args.kill_at}")
    if args.kill_at % args.every == 0:
        print(f"note: step {args.kill_at} is itself a checkpoint step, so no work is lost")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="uckpt-resume-demo-")).resolve()
    print(f"work directory: {workdir}\n")
    for name in ("uninterrupted", "interrupted"):     # ours: clear what a previous demo left
        shutil.rmtree(workdir / name, ignore_errors=True)
        (workdir / name).mkdir(parents=True)
    a_dir, bc_dir = workdir / "uninterrupted", workdir / "interrupted"
    root_a, log_a = a_dir / "checkpoints", a_dir / "loss.log"
    root_bc, log_b, log_c = (bc_dir / "checkpoints", bc_dir / "loss-before-kill.log",
                             bc_dir / "loss-after-resume.log")

    t = time.perf_counter()
    out_a = run_to_end(child_command(root_a, log_a, args))
    print(f"[A] uninterrupted run: steps 1-{args.steps} ({time.perf_counter() - t:.1f} s)")

    t = time.perf_counter()
    run_and_kill(child_command(root_bc, log_b, args, lockstep=True), args.kill_at)
    on_disk = checkpoint_steps(root_bc)
    print(f"[B] interrupted run: SIGKILLed after step {args.kill_at} "
          f"({time.perf_counter() - t:.1f} s); checkpoints on disk: "
          f"{', '.join(map(str, on_disk)) or 'none'}")

    t = time.perf_counter()
    out_c = run_to_end(child_command(root_bc, log_c, args))
    restart = restored_step_from(out_c)
    start = f"restored step {restart}" if restart else "no checkpoint yet, started over"
    print(f"[C] resumed run: {start}, ran steps {restart + 1}-{args.steps} "
          f"({time.perf_counter() - t:.1f} s)\n")

    a, b, c = read_losses(log_a), read_losses(log_b), read_losses(log_c)
    resumed = {**{s: v for s, v in b.items() if s <= restart}, **c}
    after = range(restart + 1, args.steps + 1)
    same = [s for s in after if s in a and s in resumed and same_bits(a[s], resumed[s])]

    print("loss per step (9 significant digits identify a float32; '==' compares the exact bits)")
    print(f"{'step':>6}  {'uninterrupted':>15}  {'interrupted/resumed':>19}")
    for s in range(max(1, restart - 2), args.steps + 1):
        if s == restart + 1:
            print(f"{'':6}  -- run B SIGKILLed after step {args.kill_at}; run C "
                  f"{f'resumes from checkpoint {restart}' if restart else 'starts over'} --")
        ours = resumed.get(s)
        mark = "==" if s in a and ours is not None and same_bits(a[s], ours) else "!="
        print(f"{s:>6}  {a.get(s, float('nan')):>15.9g}  "
              f"{ours if ours is not None else float('nan'):>19.9g}  {mark}")

    digest_a, digest_c = digest_from(out_a), digest_from(out_c)
    print(f"\nfinal parameters: {'identical' if digest_a == digest_c else 'DIFFERENT'} "
          f"(sha256 {digest_a[:16]}... vs {digest_c[:16]}...)")
    print(f"bitwise identical: {len(same)}/{len(after)} steps after restart")

    ok = len(same) == len(after) and digest_a == digest_c
    if ok and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    elif not ok:
        print(f"(files kept in {workdir})")
    return {"mode": "custom loop", "compared": len(after), "same": len(same), "ok": ok}


# ---------------------------------------------------------------------------------------
# The other frameworks, and all of them in a row
# ---------------------------------------------------------------------------------------
TESTS = Path(__file__).resolve().parents[1] / "tests"


def header(title):
    print(f"\n{'=' * 78}\n{title}\n{'=' * 78}", flush=True)


def other_demo(framework, args):
    """The TensorFlow (loop, fit) or Chainer (loop, trainer) demos; a result per mode."""
    if framework == "tensorflow":
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"     # inherited by the training processes
        sys.path.insert(0, str(TESTS))
        import tf_resume as module
        modes = {"loop": "custom loop (tf.GradientTape)", "fit": "model.fit + uckpt.keras"}
    else:
        import chainer_demo as module
        modes = {"loop": "custom loop", "trainer": "Trainer + uckpt.chainer.snapshot"}
    base = Path(args.workdir or tempfile.mkdtemp(prefix=f"uckpt-{framework}-demo-")).resolve()
    results = []
    for mode, title in modes.items():
        header(f"{framework}: {title}")
        t = time.perf_counter()
        r = module.demo(mode, base / mode)
        r["ok"] = r["same"] == r["compared"] and r["digests_equal"] and r["before_kill_same"]
        r["mode"] = mode
        print(f"({time.perf_counter() - t:.1f} s)", flush=True)
        results.append(r)
    if all(r["ok"] for r in results) and not args.workdir:
        shutil.rmtree(base, ignore_errors=True)
    elif not all(r["ok"] for r in results):
        print(f"(files kept in {base})")
    return results


def run_all(args, frameworks):
    rows = []
    for fw in frameworks:
        if fw == "torch":
            header("torch: custom loop (ResumableSampler)")
            sub = args
            if args.workdir:
                sub = argparse.Namespace(**{**vars(args), "workdir": str(Path(args.workdir) / fw)})
            rows.append((fw, torch_demo(sub)))
        else:
            sub = args
            if args.workdir and len(frameworks) > 1:
                sub = argparse.Namespace(**{**vars(args), "workdir": str(Path(args.workdir) / fw)})
            rows += [(fw, r) for r in other_demo(fw, sub)]
    if len(frameworks) > 1:
        header("summary")
        print(f"{'framework':<12} {'mode':<14} {'steps compared':>14}  identical?")
        for fw, r in rows:
            print(f"{fw:<12} {r['mode']:<14} {r['compared']:>14}  "
                  f"{'yes' if r['ok'] else 'NO'} ({r['same']}/{r['compared']})")
    ok = all(r["ok"] for _, r in rows)
    print(f"\n{'all runs bitwise identical after restart' if ok else 'SOME RUNS DIFFER'}")
    return 0 if ok else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", choices=["torch", "tensorflow", "chainer", "all"],
                   default="all", help="which demo to run (default all)")
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--kill-at", type=int, default=37,
                   help="SIGKILL the interrupted run after this step (default 37)")
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps (default 10)")
    p.add_argument("--workdir", help="where checkpoints and logs go (default: a temporary "
                                     "directory, removed when the demo succeeds)")
    p.add_argument("--train-into", metavar="DIR",
                   help="run the training alone, checkpointing into DIR (resumes from it)")
    p.add_argument("--log", help="with --train-into: append 'step loss.hex()' lines here")
    p.add_argument("--lockstep", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.every < 1:
        p.error("--steps and --every must be at least 1")
    if args.train_into:
        return train(args.train_into, steps=args.steps, every=args.every, log=args.log,
                     lockstep=args.lockstep)
    if not 1 <= args.kill_at < args.steps:
        p.error(f"--kill-at must be between 1 and {args.steps - 1}")
    if args.framework == "torch":
        return demo(args)
    if args.framework == "all":
        return run_all(args, ["torch", "tensorflow", "chainer"])
    return run_all(args, [args.framework])


if __name__ == "__main__":
    sys.exit(main())
