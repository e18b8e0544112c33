"""The two CRC-32C implementations (uckpt.codecs.checksum): the ``crc32c`` package and, where
installed, ``crc32c-rs``. They must give the same values, so a checkpoint written with
either loads and verifies with the other, and a faulty one is never used."""
import os
import subprocess
import sys
from pathlib import Path

import crc32c as reference
import numpy as np
import pytest

import uckpt
from uckpt.codecs import checksum
from uckpt import errors
from conftest import flip_byte

SRC = str(Path(__file__).resolve().parents[1] / "src")

fast = pytest.importorskip("crc32c_rs", reason="crc32c-rs (extra `fast`) is not installed")


def test_fast_backend_is_used_where_installed():
    assert checksum.BACKEND == "crc32c-rs"


@pytest.mark.parametrize("seed", range(4))
def test_backends_agree_on_random_buffers_and_chains(seed):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=int(rng.integers(1, 3 << 20)), dtype=np.uint8)
    cuts = np.sort(rng.integers(0, data.nbytes, size=7))
    value = 0
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, data.nbytes]):
        value = checksum.crc32c(data[lo:hi], value)
    assert value == reference.crc32c(data) == fast.crc32c(data.tobytes())


def test_a_backend_that_differs_is_refused():
    assert checksum._agrees(fast.crc32c) and checksum._agrees(reference.crc32c)
    assert not checksum._agrees(lambda data, value=0: 0)

    def wrong_tail(data, value=0):  # right except for one ragged length
        got = reference.crc32c(data, value)
        return got ^ 1 if len(memoryview(data)) == 131 else got

    assert not checksum._agrees(wrong_tail)
    assert not checksum._agrees(lambda data, value=0: 1 // 0)  # one that cannot even run


def _python(code: str, **env) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": SRC, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_reference_can_be_chosen():
    assert _python("from uckpt.codecs import checksum; print(checksum.BACKEND)",
                   UCKPT_CRC32C="crc32c") == "crc32c"


def test_a_checkpoint_written_with_one_backend_verifies_with_the_other(tmp_path):
    state = {f"a{i}": np.random.default_rng(i).standard_normal((i + 1, 999)).astype(np.float32)
             for i in range(20)}
    uckpt.save(tmp_path / "fast", state)
    np.savez(tmp_path / "state.npz", **state)
    code = ("import sys, numpy as np, uckpt; from uckpt.codecs import checksum; "
            "assert checksum.BACKEND == 'crc32c', checksum.BACKEND; "
            "got = uckpt.load(sys.argv[1]); want = np.load(sys.argv[2]); "
            "assert all((got[k] == want[k]).all() for k in want.files); uckpt.verify(sys.argv[1]); "
            "uckpt.save(sys.argv[3], dict(want))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fast"),
                          str(tmp_path / "state.npz"), str(tmp_path / "ref")],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": SRC, "UCKPT_CRC32C": "crc32c"})
    assert out.returncode == 0, out.stderr
    uckpt.verify(tmp_path / "ref")
    got = uckpt.load(tmp_path / "ref")
    for k, v in state.items():
        np.testing.assert_array_equal(got[k], v)
    offset = uckpt.manifest(tmp_path / "ref").arrays["a7"].chunks[0].offset
    flip_byte(tmp_path / "ref" / "data-00000.bin", offset + 5)
    with pytest.raises(errors.ChecksumMismatchError) as ei:
        uckpt.load(tmp_path / "ref")
    assert ei.value.leaf == "a7"
