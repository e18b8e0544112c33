"""A data file (or object) must be exactly as long as the manifest's ``size`` (docs/format.md
section 9): a longer one is damage on load, verify, restore, ls and a copy to another tier,
named with the file, the size found and the size recorded."""
import re

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.cli.scan import scan
from uckpt.manager.tiers import copy_checkpoint
from incremental_common import manager, state
from s3_server import s3_bucket, s3_server  # noqa: F401

STATE = {"w": np.arange(1000, dtype=np.float32), "b": np.ones(8)}


def grow(path, extra: bytes = b"\0") -> int:
    """Append ``extra`` to the file at ``path``; returns its size before."""
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(extra)
    return size


def longer(path, size: int, extra: int = 1) -> str:
    return (rf"data file '{re.escape(str(path))}' is longer than the manifest records: "
            rf"{size + extra} bytes, the manifest records {size}")


def test_longer_data_file_is_refused_by_load_verify_and_restore(tmp_path):
    with uckpt.CheckpointManager(tmp_path) as mgr:
        mgr.save(1, STATE)
        mgr.save(2, STATE)
    data = tmp_path / "step_00000002" / "data-00000.bin"
    size = grow(data)
    with pytest.raises(errors.CorruptCheckpointError, match=longer(data, size)):
        uckpt.load(data.parent)
    with pytest.raises(errors.CorruptCheckpointError, match=longer(data, size)):
        uckpt.verify(data.parent)
    with pytest.warns(RuntimeWarning, match="skipping checkpoint step 2"):
        got = uckpt.CheckpointManager(tmp_path).restore(out := {"w": None, "b": None})
    assert got == 1 and np.array_equal(out["w"], STATE["w"])
    listed = {f.name: (f.status, f.reason) for f in scan(tmp_path)}
    assert listed["step_00000002"] == (
        "damaged", f"data file data-00000.bin is longer than its manifest records: "
                   f"{size + 1} of {size} bytes")
    assert listed["step_00000001"] == ("committed", "")


def test_longer_base_file_is_refused(tmp_path):
    with manager(tmp_path, incremental=True) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
    assert uckpt.manifest(tmp_path / "step_00000002").bases
    data = tmp_path / "step_00000001" / "data-00000.bin"
    size = grow(data, b"\0" * 4096)
    with pytest.raises(errors.CorruptCheckpointError, match=longer(data, size, 4096)):
        uckpt.load(tmp_path / "step_00000002")


def test_copy_to_another_tier_refuses_a_longer_file(tmp_path):
    src = uckpt.save(tmp_path / "fast" / "ck", STATE)
    data = src / "data-00000.bin"
    size = grow(data)
    with pytest.raises(errors.CorruptCheckpointError, match=longer(data, size)):
        copy_checkpoint(src, tmp_path / "durable" / "ck")
    assert not (tmp_path / "durable" / "ck").exists()
    assert not [p for p in (tmp_path / "durable").iterdir() if p.name != ".uckpt-writer.lock"]


def test_longer_object_is_refused(s3_server, s3_bucket):
    url = f"s3://{s3_bucket}/run/ck"
    opts = s3_server.storage_options
    uckpt.save(url, STATE, storage_options=opts)
    client, key = s3_server.client(), "run/ck/data-00000.bin"
    body = client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
    client.put_object(Bucket=s3_bucket, Key=key, Body=body + b"\0")
    with pytest.raises(errors.CorruptCheckpointError, match=longer(url + "/data-00000.bin",
                                                                  len(body))):
        uckpt.load(url, storage_options=opts)
