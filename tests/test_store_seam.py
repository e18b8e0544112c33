"""Callers that go through the checkpoint layer whatever the store (issue 26, item 2):
`uckpt convert` writes a uckpt target through a store's sink (so also to an object store),
and the one CLI listing gives the same answers for a local root and an S3 root holding
the same checkpoints. Real files, the real SeaweedFS server of tests/s3_server.py."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.cli.main import main
from uckpt.cli.scan import scan
from uckpt.conversion.api import convert
from uckpt.conversion.errors import UnknownFormatError
from s3_server import s3_bucket, s3_options, s3_server  # noqa: F401
from test_s3_tier import keys

ARRAYS = {"w": np.arange(300_000, dtype=np.float32).reshape(600, 500),
          "b": np.linspace(0, 1, 7), "empty": np.zeros((0, 3), np.int16)}


def cli_flags(server):
    return ["--endpoint-url", server.endpoint_url] + \
        [f"--storage-option={k}={v}" for k, v in server.storage_options.items()
         if k != "endpoint_url"]


def assert_arrays(tree):
    assert sorted(tree) == sorted(ARRAYS)
    for k, a in ARRAYS.items():
        assert tree[k].dtype == a.dtype and tree[k].shape == a.shape
        assert tree[k].tobytes() == a.tobytes()


def test_convert_writes_a_uckpt_target_to_an_object_store(tmp_path, s3_server, s3_bucket,
                                                          s3_options, capsys):
    src = tmp_path / "model.npz"
    np.savez(src, **ARRAYS)
    dst = f"s3://{s3_bucket}/conv/model"
    convert(src, dst, storage_options=s3_options)
    assert_arrays(uckpt.load(dst, storage_options=s3_options))
    assert sorted(keys(s3_server, s3_bucket)) == ["conv/model/data-00000.bin",
                                                   "conv/model/manifest.json"]
    assert not os.path.exists("s3:")  # nothing written to a local path named like the URL
    # the CLI, compressed, to another name; then verified there
    assert main(["convert", "-q", "--compress", str(src), f"s3://{s3_bucket}/conv/zipped"]
                + cli_flags(s3_server)) == 0
    m = uckpt.verify(f"s3://{s3_bucket}/conv/zipped", storage_options=s3_options)
    assert all(c.codec != "raw" for c in m.arrays["w"].chunks)  # compressed
    assert_arrays(uckpt.load(f"s3://{s3_bucket}/conv/zipped", storage_options=s3_options))
    # a committed checkpoint is replaced only with force
    with pytest.raises(errors.CheckpointExistsError, match="already holds a committed "
                                                           "checkpoint(.|\n)*--force"):
        convert(src, dst, storage_options=s3_options)
    np.savez(src, **{**ARRAYS, "w": ARRAYS["w"] + 1})
    convert(src, dst, storage_options=s3_options, force=True)
    assert uckpt.load(dst, storage_options=s3_options)["w"][0, 0] == 1
    capsys.readouterr()


def test_convert_to_an_object_store_refuses_a_file_format_before_writing(tmp_path, s3_server,
                                                                         s3_bucket, s3_options):
    src = tmp_path / "model.npz"
    np.savez(src, **ARRAYS)
    with pytest.raises(UnknownFormatError, match="only a uckpt checkpoint is written to an "
                                                 "object store"):
        convert(src, f"s3://{s3_bucket}/out.safetensors", storage_options=s3_options)
    assert keys(s3_server, s3_bucket) == {}


def test_a_failed_conversion_to_an_object_store_leaves_nothing(tmp_path, s3_server, s3_bucket,
                                                               s3_options):
    src = tmp_path / "model.npz"
    np.savez(src, **ARRAYS)
    calls = []

    def interrupt(done, total):
        calls.append(done)
        if done:
            raise KeyboardInterrupt  # Ctrl-C while the data file is written

    with pytest.raises(KeyboardInterrupt):
        convert(src, f"s3://{s3_bucket}/conv/cut", storage_options=s3_options,
                progress=interrupt)
    assert calls and keys(s3_server, s3_bucket) == {}


def save_steps(root, opts=None):
    """Steps 1 and 2 committed, step 3 committed then its data file cut short."""
    with uckpt.CheckpointManager(root, keep=10, storage_options=opts) as m:
        for s in (1, 2, 3):
            m.save(s, {"w": np.full(1000, s, np.float32)})
        return m.path(3)


def listed(found):
    return [(f.step, f.status, f.name, f.size, f.reason) for f in found]


def test_one_listing_gives_the_same_answers_for_a_local_and_an_s3_root(
        tmp_path, s3_server, s3_bucket, s3_options, capsys):
    local, remote = tmp_path / "run", f"s3://{s3_bucket}/run"
    damaged_local = save_steps(local)
    save_steps(remote, s3_options)
    size = os.path.getsize(damaged_local / "data-00000.bin")
    with open(damaged_local / "data-00000.bin", "r+b") as f:
        f.truncate(size - 8)
    client = s3_server.client()
    body = client.get_object(Bucket=s3_bucket, Key="run/step_00000003/data-00000.bin")["Body"]
    client.put_object(Bucket=s3_bucket, Key="run/step_00000003/data-00000.bin",
                      Body=body.read()[:size - 8])
    here, there = scan(local), scan(remote, s3_options)
    assert listed(here) == listed(there)
    assert [(f.step, f.status) for f in here] == [(1, "committed"), (2, "committed"),
                                                  (3, "damaged")]
    assert here[2].reason == f"data file data-00000.bin is truncated: {size - 8} of {size} bytes"
    # the CLI: the same table, the same JSON (but for the paths), the same verdicts
    docs = []
    for root in (str(local), remote):
        assert main(["ls", "--json", root] + cli_flags(s3_server)) == 0
        doc = json.loads(capsys.readouterr().out)["checkpoints"]
        docs.append([{k: v for k, v in c.items() if k not in ("path", "created")} for c in doc])
        assert main(["verify", "--all", root] + cli_flags(s3_server)) == 1
        out = capsys.readouterr()
        assert out.out.count("OK: ") == 2 and "step_00000003" in out.err
    assert docs[0] == docs[1]
    # a root that is itself a checkpoint is listed as that one checkpoint, both ways
    one = [listed(scan(str(local / "step_00000002"))),
           listed(scan(f"{remote}/step_00000002", s3_options))]
    assert one[0] == one[1] and one[0][0][:3] == (2, "committed", "step_00000002")
