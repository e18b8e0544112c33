"""A damaged manifest is always caught (format versions 2 and 3, docs/format.md section 3.4).

Every single changed byte of a real manifest is detected by ``uckpt.load``,
``uckpt verify`` (in-process for speed, and a few times as a real subprocess) and
``CheckpointManager.restore``, which falls back to the previous step with exactly
its values. Version-1 checkpoints, which have no manifest checksum, still load,
and ``uckpt verify`` says that their manifest could not be checked.
"""
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt.format import FORMAT_VERSION
from uckpt.format import encode_manifest, parse_manifest
from uckpt import errors
from uckpt.cli.main import main as cli_main
from uckpt.format import Manifest, integrity
from grid_listing import listed

GOLDEN_V1 = Path(__file__).resolve().parent / "data" / "golden_v1"
TRIALS = 1000
RESTORE_TRIALS = 100
#: the fixed form at the end: '"manifest_checksum":' + '"crc32c:' + 8 digits + '"}' + line feed
FIXED = len(integrity.KEY) + integrity.TAIL_BYTES


def make_state(step):
    """A state of several arrays, a nested tree, plain values and an int-keyed dict."""
    rng = np.random.default_rng(step)
    return {
        "model": {"layers": [{"w": rng.standard_normal((4, 3)).astype(np.float32),
                              "b": np.full(3, step, dtype=np.float64)} for _ in range(2)],
                  "embed": np.arange(12, dtype=np.int64).reshape(6, 2) * step},
        "optimizer": {"lr": 0.2 / step, "betas": (0.9, 0.999), "state": {0: np.ones(2) * step,
                                                                        7: "adam"}},
        "epoch": step, "name": f"run-{step}", "flag": step % 2 == 0, "blob": bytes([step, 255]),
    }


def assert_same(got, want, where="state"):
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, where
        assert got.shape == want.shape and got.tobytes() == want.tobytes(), where
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            assert_same(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}/{i}")
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


def changes(raw: bytes, count: int, seed: int):
    """``count`` random single-byte changes of ``raw``: (offset, the changed file)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        offset = int(rng.integers(0, len(raw)))
        damaged = bytearray(raw)
        damaged[offset] = (raw[offset] + int(rng.integers(1, 256))) % 256  # never the same
        yield offset, bytes(damaged)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = uckpt.save(tmp_path_factory.mktemp("ckpt") / "c", make_state(3), step=3,
                      metadata={"lr_schedule": [0.2, 0.1], "note": "h\u00e9llo"})
    return path, (path / "manifest.json").read_bytes()


def run_verify(capsys, path):
    rc = cli_main(["verify", str(path)])
    out = capsys.readouterr()
    return rc, out.out, out.err


# --- every single-byte change is caught ---------------------------------------------------------
def test_the_real_manifest_is_sealed(checkpoint):
    path, raw = checkpoint
    m = parse_manifest(raw)
    assert m.format_version == FORMAT_VERSION and m.checksum == integrity.check(raw, "x")
    assert m.step == 3 and len(m.arrays) >= 6 and m.metadata["note"] == "h\u00e9llo"
    assert raw.endswith(b'"manifest_checksum":"' + m.checksum.encode() + b'"}\n')


def test_random_byte_changes_are_caught_by_load_and_verify(checkpoint, tmp_path, capsys):
    src, raw = checkpoint
    path = shutil.copytree(src, tmp_path / "c")
    manifest = path / "manifest.json"
    kinds = {}
    for offset, damaged in changes(raw, TRIALS, seed=10):
        manifest.write_bytes(damaged)
        with pytest.raises(errors.ManifestError) as info:
            uckpt.load(path)
        error = info.value
        kinds[type(error).__name__] = kinds.get(type(error).__name__, 0) + 1
        if offset < len(raw) - FIXED:  # before the checksum member: the CRC tells
            assert isinstance(error, errors.ManifestChecksumError), (offset, error)
            assert error.stored != error.computed and error.stored in str(error)
        rc, out, err = run_verify(capsys, path)
        assert rc == 1 and "OK" not in out, (offset, out, err)
        assert err.startswith("uckpt: error: ") and str(manifest) in err, (offset, err)
    assert kinds.get("ManifestChecksumError", 0) >= TRIALS * 0.95, kinds
    manifest.write_bytes(raw)  # undamaged again: all is well
    assert run_verify(capsys, path)[0] == 0
    assert_same(uckpt.load(path), make_state(3))


def test_every_offset_and_every_trailer_byte_value(checkpoint):
    """Exhaustive where it is cheap: each offset changed (two ways), and every possible
    value of each of the last 40 bytes (the trailer and the version-independent key)."""
    _, raw = checkpoint
    cases = [(o, raw[o] ^ x) for o in range(len(raw)) for x in (0x01, 0xFF)]
    cases += [(o, v) for o in range(len(raw) - 40, len(raw)) for v in range(256) if v != raw[o]]
    for offset, value in cases:
        damaged = bytearray(raw)
        damaged[offset] = value
        with pytest.raises(errors.ManifestError):
            parse_manifest(bytes(damaged))
    for extra in (b"\n", b" "):  # a byte added at the end: still JSON, no longer sealed
        with pytest.raises(errors.ManifestChecksumError):
            parse_manifest(raw + extra)
    with pytest.raises(errors.ManifestError, match="not valid UTF-8 JSON"):
        parse_manifest(raw + b"\x00")
    with pytest.raises(errors.ManifestError):
        parse_manifest(raw[:-1])


def test_every_possible_single_byte_change_of_a_small_manifest(tmp_path):
    """All 255 other values at every offset of a real (compact, 1 KB) manifest."""
    path = uckpt.save(tmp_path / "c", {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                                       "lr": 0.2, "tag": b"hi"}, step=7, metadata={"a": 1})
    raw = (path / "manifest.json").read_bytes()
    assert 500 < len(raw) < 2000
    caught = 0
    for offset in range(len(raw)):
        damaged = bytearray(raw)
        for value in range(256):
            if value == raw[offset]:
                continue
            damaged[offset] = value
            with pytest.raises(errors.ManifestError):
                parse_manifest(bytes(damaged))
            caught += 1
    assert caught == 255 * len(raw)


def test_a_few_changes_through_the_real_command(checkpoint, tmp_path):
    src, raw = checkpoint
    path = shutil.copytree(src, tmp_path / "c")
    covered = [(o, d) for o, d in changes(raw, 20, seed=11) if o < len(raw) - FIXED]
    for offset, damaged in covered[:4] + [(len(raw) - 1, raw[:-1] + b" ")]:
        (path / "manifest.json").write_bytes(damaged)
        proc = subprocess.run([sys.executable, "-m", "uckpt.cli.main", "verify", str(path)],
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONWARNINGS="ignore"))
        assert proc.returncode == 1, (offset, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and "OK" not in proc.stdout
        assert str(path / "manifest.json") in proc.stderr
        assert ("the manifest is damaged" if offset < len(raw) - FIXED
                else "must end with its checksum member") in proc.stderr


def test_restore_falls_back_past_a_damaged_manifest(tmp_path):
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as manager:
        for step in (1, 2):
            manager.save(step, make_state(step))
    newest = root / "step_00000002" / "manifest.json"
    raw = newest.read_bytes()
    with uckpt.CheckpointManager(root) as manager:
        for offset, damaged in changes(raw, RESTORE_TRIALS, seed=12):
            newest.write_bytes(damaged)
            state = make_state(5)  # neither saved state: every value must be overwritten
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert manager.restore(state) == 1, offset
            assert any("step 2" in str(w.message) and "manifest" in str(w.message)
                       for w in caught), [str(w.message) for w in caught]
            assert_same(state, make_state(1))
        newest.write_bytes(raw)
        state = make_state(5)
        assert manager.restore(state) == 2
        assert_same(state, make_state(2))


def test_the_issue_case_a_changed_digit_of_a_learning_rate(checkpoint, tmp_path):
    """Still valid JSON, still a valid manifest: only the checksum can tell."""
    src, raw = checkpoint
    text = raw.decode("utf-8")
    lr = json.dumps(make_state(3)["optimizer"]["lr"])
    assert text.count(lr) == 1
    damaged = text.replace(lr, lr[:-1] + str((int(lr[-1]) + 1) % 10)).encode("utf-8")
    with pytest.raises(errors.ManifestChecksumError) as info:
        parse_manifest(damaged, where="m.json")
    e = info.value
    assert isinstance(e, errors.CorruptCheckpointError) and isinstance(e, ValueError)
    assert str(e).startswith("m.json: the manifest is damaged")
    assert e.stored in str(e) and e.computed in str(e) and "hint:" in str(e)
    assert e.path == "m.json"


# --- the rules around the checksum member -----------------------------------------------------
def _body_text(raw: bytes, version=None) -> str:
    """The manifest without its checksum member, as a JSON object text; with ``version``
    (1 to 3), also without the fields of version 4 (content hashes, Merkle roots, bases)."""
    doc = listed(json.loads(raw))  # grids as chunk lists (versions before 5 have no grid)
    del doc[integrity.FIELD]
    if version is not None:
        doc["format_version"] = version
        del doc["bases"], doc["merkle_root"]
        for a in doc["arrays"].values():
            del a["root"]
            for c in a["chunks"]:
                del c["hash"]
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def test_version_2_without_its_checksum_is_damaged(checkpoint):
    _, raw = checkpoint
    text = _body_text(raw)
    for variant in (text, text + "\n", text[:-1] + ',"manifest_checksum":"crc32c:00000000"}',
                    raw.decode()[:-1] + "\r\n", raw.decode().replace('"}\n', '" }\n')):
        with pytest.raises(errors.ManifestChecksumError,
                           match="must end with its checksum") as info:
            parse_manifest(variant.encode("utf-8"), where="m.json")
        assert info.value.stored is None and "m.json" in str(info.value)


def test_checksum_must_be_the_last_member_and_match(checkpoint):
    _, raw = checkpoint
    text = _body_text(raw)
    # a sealed file whose trailing member is a different key (an escaped quote in it)
    tricky = integrity.seal(text[:-1].encode() + b',"x\\"', separator=b"")
    assert tricky.endswith(b'"}\n') and integrity.check(tricky, "m") is not None
    with pytest.raises(errors.ManifestError):
        parse_manifest(tricky)
    # the member present twice (a duplicate key), or earlier in the object
    early = text.replace('{"format":"uckpt",',
                         '{"manifest_checksum":"crc32c:00000000","format":"uckpt",', 1)
    with pytest.raises(errors.ManifestError, match="manifest_checksum"):
        parse_manifest(integrity.seal(early[:-1].encode()))
    # sealing the same object again gives the same bytes: the checksum is a function of them
    assert integrity.seal(raw[:-integrity.TAIL_BYTES - len(integrity.KEY) - 1]) == raw


def test_version_1_with_a_checksum_member_is_refused(checkpoint):
    """Version 1 knows no such field, even a correct one."""
    _, raw = checkpoint
    text = _body_text(raw, version=1)
    with pytest.raises(errors.ManifestError, match="unknown field.*manifest_checksum"):
        parse_manifest(integrity.seal(text[:-1].encode()))
    parse_manifest(text.encode())  # and without it, it is a valid version-1 manifest


def test_seal_is_what_to_bytes_writes(checkpoint):
    _, raw = checkpoint
    m = parse_manifest(raw)
    again = encode_manifest(m)
    assert again == raw  # the same fields in the same order, the same checksum
    v1 = parse_manifest(_body_text(raw, version=1).encode())
    assert v1.format_version == 1 and v1.checksum is None
    # version 4 needs every chunk's content hash: a version-1 manifest cannot give them
    with pytest.raises(errors.ManifestError, match="without reading its data"):
        encode_manifest(v1)


# --- version 1: read, verified, and said to be unchecked ----------------------------------------
@pytest.mark.parametrize("name", ["all_types", "example", "sharded"])
def test_version_1_golden_loads_and_verifies_with_a_note(name, capsys):
    path = GOLDEN_V1 / name
    assert uckpt.manifest(path).format_version == 1 and uckpt.manifest(path).checksum is None
    assert uckpt.load(path)
    rc, out, err = run_verify(capsys, path)
    assert rc == 0 and err == ""
    assert out.startswith("OK: ") and str(path) in out
    assert "note: format version 1 has no manifest checksum" in out


def test_version_1_note_through_the_real_command(tmp_path):
    v1 = shutil.copytree(GOLDEN_V1 / "example", tmp_path / "v1")
    v2 = uckpt.save(tmp_path / "v2", uckpt.load(v1), step=7)
    proc = subprocess.run([sys.executable, "-m", "uckpt.cli.main", "verify", str(v1), str(v2)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("OK: ") and lines[2].startswith("OK: ")
    assert "note: format version 1" in lines[1] and str(v2) in lines[2]
    assert uckpt.manifest(v2).format_version == FORMAT_VERSION  # saving again gives a checked manifest


def test_a_version_1_manifest_changed_into_version_2_is_refused(tmp_path):
    path = shutil.copytree(GOLDEN_V1 / "example", tmp_path / "c")
    raw = (path / "manifest.json").read_bytes()
    assert raw.count(b'"format_version": 1') == 1
    (path / "manifest.json").write_bytes(
        raw.replace(b'"format_version": 1', b'"format_version": 2'))
    with pytest.raises(errors.ManifestChecksumError):
        uckpt.load(path)
