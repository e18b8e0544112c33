"""``python -m uckpt.cli.s3_server``: the local S3 endpoint the README offers for trying
the S3 tiers by hand. It prints ``export`` lines that point uckpt at it, serves a save and
a load there, and stops on Ctrl-C (SIGINT), removing its temporary data."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import uckpt
from conftest import REPO

pytestmark = pytest.mark.s3


def test_endpoint_by_hand_serves_a_save_and_stops_on_ctrl_c(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO / "adapters")]),
               TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "uckpt.cli.s3_server", "--bucket", "bkt"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("# SeaweedFS S3 endpoint, bucket 'bkt'"), lines
        exports = dict(line.strip()[len("export "):].split("=", 1) for line in lines[1:])
        assert set(exports) == {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        options = {"endpoint_url": exports["AWS_ENDPOINT_URL"],
                   "key": exports["AWS_ACCESS_KEY_ID"], "secret": exports["AWS_SECRET_ACCESS_KEY"]}
        uckpt.save("s3://bkt/ck", {"w": np.arange(5.0)}, storage_options=options)
        assert (uckpt.load("s3://bkt/ck", storage_options=options)["w"] == np.arange(5.0)).all()
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    assert rc == 0, proc.stderr.read()
    assert not list(tmp_path.glob("uckpt-s3-*")), "its temporary data directory was left"


def test_an_invalid_bucket_name_is_an_error_not_a_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO / "adapters")]),
               TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "uckpt.cli.s3_server", "--bucket", "b"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "error: bucket 'b' could not be made" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("uckpt-s3-*"))
