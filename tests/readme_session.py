"""One reader's session with README.md: every ```python block, in order, in one Python
process and one namespace, as a user pastes them one after another into ``python``.

Run by tests/test_readme.py as ``python readme_session.py README BUCKET S3_OPTIONS_JSON``
in the session's working directory. Before each block, every module is taken out of the
namespace, so a block that uses ``uckpt`` (or ``time``) without importing it fails here, as it
would pasted on its own. What the README leaves out (the training step, the evaluation, the
cluster's paths, the S3 endpoint) is supplied by the stand-ins below; the absolute paths and
the bucket are pointed at this directory and the test's S3 server.
"""
import json
import os
import re
import sys
import time
import types
from pathlib import Path

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
#: blocks (by index) that are jobs of their own, and the directory each runs under; the
#: evaluator watches the distributed job's root (both say "/shared/job")
OWN_ROOTS = {1: "two-tier", 4: "compressed", 5: "incremental", 6: "options"}
EVALUATOR = 7


def blocks(readme):
    return BLOCK.findall(Path(readme).read_text())


def localized(code, root, bucket):
    """The block with its absolute paths under ``root`` and its bucket the test's."""
    for path in ("/shared/job", "/local/nvme/run1", "/shared/run1",
                 "/ckpt/run1", "/export/final"):
        code = code.replace(f'"{path}"', repr(str(root / path.strip("/"))))
    code = code.replace("s3://bucket/", f"s3://{bucket}/")
    code = re.sub(r'storage_options=\{"endpoint_url": "http://minio:9000", [^}]*\}',
                  "storage_options=S3_OPTIONS", code)
    code = code.replace("storage_options={...}", "storage_options=S3_OPTIONS")
    # a line "..." is the training between restore and save: five steps of it
    return re.sub(r"^\.\.\.$", "step = start + 5", code, flags=re.M)


def stand_ins():
    """What the README assumes exists around its snippets."""
    calls = {"evaluated": [], "polls": 0}

    def training_is_running():
        calls["polls"] += 1
        return calls["polls"] <= 2

    return {"total": 200, "train_one_step": lambda: 0.5,
            "evaluate": lambda model, step: calls["evaluated"].append(step),
            "training_is_running": training_is_running, "_calls": calls}


def main(readme, bucket, s3_options):
    import torch  # for the evaluator's model only; the blocks import their own

    real_sleep = time.sleep
    # the evaluator's poll (a minute, waiting for the trainer) stands for no wait here
    time.sleep = lambda s: None if s >= 60 else real_sleep(s)
    cwd = Path.cwd()
    ns = stand_ins()
    ns["S3_OPTIONS"] = s3_options
    managers = []
    try:
        for i, code in enumerate(blocks(readme)):
            for name in [k for k, v in ns.items() if isinstance(v, types.ModuleType)]:
                del ns[name]  # each block imports what it uses
            if i == EVALUATOR:
                ns["eval_model"] = torch.nn.Linear(4, 2)
            root = cwd / OWN_ROOTS[i] if i in OWN_ROOTS else cwd
            exec(compile(localized(code, root, bucket), f"README.md block {i + 1}", "exec"), ns)
            manager = ns.get("manager")
            if type(manager).__name__ == "CheckpointManager" and manager not in managers:
                managers.append(manager)
    finally:
        for m in managers:
            m.close()
    print("\n" + json.dumps({"step": ns["step"], "evaluated": ns["_calls"]["evaluated"]}))


if __name__ == "__main__":
    os.environ.setdefault("UCKPT_SHM_DIR", str(Path.cwd() / "shm"))
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
