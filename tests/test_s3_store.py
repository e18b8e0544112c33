"""The S3 client (uckpt.storage.s3) against a real SeaweedFS server (tests/s3_server.py),
with faults injected by a proxy (tests/s3_faults.py) and the server killed mid-upload."""
import concurrent.futures as cf
import logging
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from s3_server import (fault_proxy, free_ports, own_s3_server, s3_bucket,  # noqa: F401
                       s3_options, s3_server)
from s3_faults import FaultProxy

from uckpt.codecs.checksum import crc32c
from uckpt.errors import (CheckpointExistsError, CheckpointNotFoundError,
                          CorruptCheckpointError, StorageAccessError, TruncatedDataError,
                          UckptError, UnsupportedObjectError)
from uckpt.storage.s3 import S3Client, S3Options, b64_crc32c, parse_url
from uckpt.storage.s3_errors import StorageConfigError, StorageUnavailableError

pytestmark = pytest.mark.timeout(180)
MiB = 1 << 20


def data_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def client(options, bucket, **more) -> S3Client:
    return S3Client(bucket, {**options, **more})


# --- without a server --------------------------------------------------------------------
def test_parse_url():
    assert parse_url("s3://bucket/some/prefix") == ("bucket", "some/prefix")
    assert parse_url("s3://my.bucket-1/run1/") == ("my.bucket-1", "run1")
    assert parse_url("s3://bucket") == ("bucket", "")
    assert parse_url("s3://bucket/") == ("bucket", "")
    for bad in ["bucket/x", "http://bucket/x", "s3://", "s3://Bucket/x", "s3://b/x",
                "s3://bucket_1/x", "s3://bucket/a//b", "s3://bucket/a/../b", "s3://bucket/./a",
                "s3://bucket/a?versionId=1", "s3://bucket/a#f", "s3://bucket/a\\b",
                "s3://bucket/a\x00b", "s3://bucket/" + "k" * 1100, "s3://-bucket/x"]:
        with pytest.raises(StorageConfigError) as e:
            parse_url(bad)
        assert isinstance(e.value, ValueError) and repr(bad)[:40] in str(e.value)


def test_options_are_checked():
    assert S3Options.from_dict(None) == S3Options()
    assert "hidden-value" not in repr(S3Options.from_dict({"key": "k", "secret": "hidden-value"}))
    for bad, word in [({"endpoint": "http://x"}, "endpoint"), ({"key": "k"}, "secret"),
                      ({"part_bytes": 1 << 20}, "part_bytes"), ({"threads": 0}, "threads"),
                      ({"max_attempts": "3"}, "max_attempts"), ({"page_size": 5000}, "page_size"),
                      ({"endpoint_url": "127.0.0.1:9000"}, "endpoint_url"),
                      ({"retry_mode": "eager"}, "retry_mode"), ({"read_timeout": 0}, "read_timeout")]:
        with pytest.raises(StorageConfigError, match=word):
            S3Options.from_dict(bad)
    # more than 10,000 parts: the part size grows (to whole MiB)
    opts = S3Options(part_bytes=5 * MiB)
    assert opts.part_size_for(40 * MiB) == 5 * MiB
    assert opts.part_size_for(100_000 * MiB) == 10 * MiB


def test_import_uckpt_does_not_import_boto3():
    code = ("import sys, uckpt, uckpt.storage, uckpt.storage.s3 as s; "
            "s.parse_url('s3://bucket/x'); "
            "print(sorted({'boto3', 'botocore', 's3transfer'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_missing_boto3_names_the_extra():
    code = ("import sys; sys.modules['boto3'] = None; sys.modules['botocore'] = None\n"
            "from uckpt.storage.s3 import S3Client\n"
            "from uckpt.storage.s3_errors import StorageDependencyError\n"
            "try:\n    S3Client('bucket', {'endpoint_url': 'http://127.0.0.1:1'})\n"
            "except StorageDependencyError as e:\n"
            "    assert isinstance(e, ImportError); print('REFUSED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "REFUSED" in out.stdout and "pip install 'uckpt[s3]'" in out.stdout


# --- round trips -------------------------------------------------------------------------
def test_small_objects_round_trip(s3_server, s3_bucket):
    c = S3Client(s3_bucket, s3_server.storage_options)
    arr = data_of(1000).view(np.float32).reshape(10, 25)
    c.put("a/array", arr)                    # a NumPy array, as a buffer
    c.put("a/bytes", b"hello")
    c.upload("a/empty", b"", 0)
    assert c.get("a/bytes", 5) == b"hello"
    assert c.get("a/array", 1000) == arr.tobytes()
    assert c.get("a/empty", 0) == b""
    info = c.head("a/array")
    assert (info.size, c.size("a/bytes"), c.size("a/empty")) == (1000, 5, 0)
    # the store keeps and reports the CRC-32C sent with the PUT (which it checked)
    assert info.checksum_crc32c == b64_crc32c(crc32c(arr))
    assert c.exists("a/bytes") and not c.exists("a/nothing") and not c.exists("a")
    assert c.crc32c_of("a/array", 1000) == crc32c(arr)
    assert c.crc32c_of("a/empty", 0) == 0


def test_multipart_round_trip_and_range_reads(s3_server, s3_bucket, tmp_path):
    c = client(s3_server.storage_options, s3_bucket, part_bytes=5 * MiB, threads=4)
    data = data_of(40 * MiB + 12345)
    local = tmp_path / "data.bin"
    data.tofile(local)
    c.upload("m/from-buffer", memoryview(data), data.nbytes)
    c.upload("m/from-path", local, data.nbytes)
    fd = os.open(local, os.O_RDONLY)
    try:
        c.upload("m/from-fd", fd, 7 * MiB)   # the first 7 MiB of the file: 2 parts
    finally:
        os.close(fd)
    assert c.incomplete_uploads("m/") == []
    for key, size in [("m/from-buffer", data.nbytes), ("m/from-path", data.nbytes),
                      ("m/from-fd", 7 * MiB)]:
        info = c.head(key)
        assert info.size == size
        assert info.etag.strip('"').endswith(f"-{-(-size // (5 * MiB))}")  # really multipart
        assert c.crc32c_of(key, size) == crc32c(data[:size])
    # ranges at odd offsets, across part boundaries, into NumPy buffers
    for offset, length in [(0, 1), (1, 4095), (5 * MiB - 3, 7), (12345, 11 * MiB + 1),
                           (data.nbytes - 17, 17)]:
        out = np.zeros(length + 5, np.uint8)
        assert c.get_range("m/from-path", offset, length, out) == length
        assert np.array_equal(out[:length], data[offset:offset + length])
        assert not out[length:].any()        # nothing written past the range
    wide = np.zeros((3, 8), np.float64)      # any C-contiguous writable buffer
    assert c.get_range("m/from-buffer", 8, wide.nbytes, wide) == wide.nbytes
    assert wide.tobytes() == data[8:8 + wide.nbytes].tobytes()
    # past the end: short reads, like pread
    out = np.zeros(100, np.uint8)
    assert c.get_range("m/from-fd", 7 * MiB - 10, 100, out) == 10
    assert c.get_range("m/from-fd", 7 * MiB, 100, out) == 0
    assert c.get_range("m/from-fd", 0, 0, out) == 0
    with pytest.raises(TruncatedDataError, match="m/from-fd"):
        c.crc32c_of("m/from-fd", 7 * MiB + 1)
    with pytest.raises(CorruptCheckpointError, match="m/from-fd"):
        c.crc32c_of("m/from-fd", 7 * MiB - 1)


def test_bad_sources_and_destinations(s3_server, s3_bucket, tmp_path):
    c = S3Client(s3_bucket, s3_server.storage_options)
    short = tmp_path / "short.bin"
    short.write_bytes(b"x" * 10)
    with pytest.raises(TruncatedDataError, match="short.bin"):
        c.upload("k", short, 11)
    with pytest.raises(CheckpointNotFoundError, match="missing.bin"):
        c.upload("k", tmp_path / "missing.bin", 1)
    with pytest.raises(UnsupportedObjectError, match="C-contiguous"):
        c.upload("k", np.zeros((4, 4))[:, ::2], 64)
    with pytest.raises(UnsupportedObjectError, match="fewer"):
        c.upload("k", b"abc", 4)
    c.put("k", b"abcdef")
    with pytest.raises(UnsupportedObjectError, match="writable"):
        c.get_range("k", 0, 3, b"xyz")
    with pytest.raises(UnsupportedObjectError, match="fewer"):
        c.get_range("k", 0, 5, bytearray(4))
    assert not c.exists("k/") and c.list("", None).objects == {"k": 6}


def test_get_refuses_objects_over_the_cap(s3_server, s3_bucket):
    c = S3Client(s3_bucket, s3_server.storage_options)
    c.put("m.json", b"x" * 100)
    assert c.get("m.json", 100) == b"x" * 100
    with pytest.raises(CorruptCheckpointError, match="s3://.*m.json.*100 bytes, more than the 99"):
        c.get("m.json", 99)
    with pytest.raises(KeyError):  # the caller's error class, as fsutil.read_capped takes
        c.get("m.json", 10, what="manifest", too_large=lambda msg, **kw: KeyError(msg))


# --- listing and deleting ------------------------------------------------------------------
def test_listing_pages_and_batched_deletes(s3_server, s3_bucket):
    c = client(s3_server.storage_options, s3_bucket, page_size=250)
    keys = [f"run/step_{i % 3}/obj-{i:05d}" for i in range(1100)] + ["run/top", "other/x"]
    with cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: c.put(k, k.encode()), keys))
    listing = c.list("run/")
    assert listing.prefixes == ["run/step_0/", "run/step_1/", "run/step_2/"]
    assert listing.objects == {"run/top": 7}
    everything = c.list("run/", delimiter=None).objects   # 1101 keys: 5 pages of 250
    assert len(everything) == 1101 and everything["run/step_1/obj-00004"] == 20
    c.delete(sorted(everything)[:1050])                   # two DeleteObjects requests
    assert len(c.list("run/", delimiter=None).objects) == 51
    c.delete(["run/never-existed"])                       # no error
    # delete_prefix takes only its own prefix: "step_1/" leaves "step_10/"
    c.put("run/step_10/keep", b"k")
    n = c.delete_prefix("run/step_1/")
    assert n == len([k for k in sorted(everything)[1050:] if k.startswith("run/step_1/")])
    assert "run/step_10/keep" in c.list("run/", None).objects
    for bad in ["", "run/step_10"]:
        with pytest.raises(StorageConfigError, match="end in '/'"):
            c.delete_prefix(bad)
    assert c.list("other/").objects == {"other/x": 7}


# --- errors --------------------------------------------------------------------------------
def test_missing_keys_and_buckets(s3_server, s3_bucket):
    c = S3Client(s3_bucket, s3_server.storage_options)
    url = f"s3://{s3_bucket}/no/such"
    for call in (lambda: c.get("no/such", 10), lambda: c.size("no/such"),
                 lambda: c.get_range("no/such", 0, 4, bytearray(4)),
                 lambda: c.crc32c_of("no/such", 4)):
        with pytest.raises(CheckpointNotFoundError) as e:
            call()
        assert isinstance(e.value, FileNotFoundError) and url in str(e.value)
    gone = c.sibling("no-such-bucket-uckpt")
    for call in (lambda: gone.get("k", 10), lambda: gone.head("k"),
                 lambda: gone.list("run/"), lambda: gone.put("k", b"x")):
        with pytest.raises(CheckpointNotFoundError, match="no bucket 'no-such-bucket-uckpt'"):
            call()
    assert not gone.exists("k")


def test_wrong_credentials(s3_server, s3_bucket):
    S3Client(s3_bucket, s3_server.storage_options).put("k", b"x")
    for creds in ({"secret": "wrong"}, {"key": "nobody", "secret": "x"}):
        c = client(s3_server.storage_options, s3_bucket, **creds)
        for call in (lambda: c.get("k", 10), lambda: c.head("k"), lambda: c.list(""),
                     lambda: c.put("k2", b"y")):
            with pytest.raises(StorageAccessError) as e:
                call()
            assert isinstance(e.value, PermissionError) and f"s3://{s3_bucket}" in str(e.value)
            assert "secret" in e.value.hint


@pytest.mark.timeout(60)
def test_unreachable_endpoint_fails_quickly():
    port = free_ports(1)[0]  # nothing listens there
    c = S3Client("bucket", {"endpoint_url": f"http://127.0.0.1:{port}", "key": "k",
                            "secret": "s", "max_attempts": 2, "connect_timeout": 1,
                            "read_timeout": 1})
    start = time.monotonic()
    for call in (lambda: c.put("a/b", b"x"), lambda: c.get("a/b", 10), lambda: c.list("a/")):
        with pytest.raises(StorageUnavailableError) as e:
            call()
        assert isinstance(e.value, ConnectionError) and isinstance(e.value, UckptError)
        assert f"127.0.0.1:{port}" in str(e.value) and "s3://bucket/a" in str(e.value)
        assert "2 attempt" in str(e.value)
    assert time.monotonic() - start < 50  # a hang would hit the timeout


# --- what SeaweedFS does with checksums and conditional writes --------------------------------
def test_store_checks_crc32c_headers(s3_server, s3_bucket):
    """SeaweedFS computes the CRC-32C of what it receives and refuses a mismatch
    (BadDigest), for PUT and for each part; it computes none of its own for an object
    sent without one."""
    import botocore.exceptions

    raw = s3_server.client()
    wrong = b64_crc32c(crc32c(b"other"))
    with pytest.raises(botocore.exceptions.ClientError, match="BadDigest"):
        raw.put_object(Bucket=s3_bucket, Key="k", Body=b"data", ChecksumCRC32C=wrong)
    up = raw.create_multipart_upload(Bucket=s3_bucket, Key="mp", ChecksumAlgorithm="CRC32C")
    with pytest.raises(botocore.exceptions.ClientError, match="BadDigest"):
        raw.upload_part(Bucket=s3_bucket, Key="mp", UploadId=up["UploadId"], PartNumber=1,
                        Body=b"part", ChecksumCRC32C=wrong)
    raw.abort_multipart_upload(Bucket=s3_bucket, Key="mp", UploadId=up["UploadId"])
    raw.put_object(Bucket=s3_bucket, Key="plain", Body=b"data")  # no checksum header
    head = raw.head_object(Bucket=s3_bucket, Key="plain", ChecksumMode="ENABLED")
    assert not [k for k in head if k.startswith("Checksum") and k != "ChecksumType"]
    assert not S3Client(s3_bucket, s3_server.storage_options).exists("k")


def test_put_if_absent(s3_server, s3_bucket):
    c = S3Client(s3_bucket, s3_server.storage_options)
    c.put("lock", b"holder=1", if_absent=True)
    with pytest.raises(CheckpointExistsError) as e:
        c.put("lock", b"holder=2", if_absent=True)   # If-None-Match: * -> 412
    assert isinstance(e.value, FileExistsError) and f"s3://{s3_bucket}/lock" in str(e.value)
    c.put("lock", b"holder=1", if_absent=True)       # the same bytes: a retried write of ours
    assert c.get("lock", 100) == b"holder=1"
    c.put("lock", b"holder=3")                       # unconditional writes replace
    assert c.get("lock", 100) == b"holder=3"


def test_put_if_absent_whose_answer_is_lost(fault_proxy, s3_bucket):
    """The PUT reaches the store, its answer is lost; botocore retries, the store answers
    412: the object holds our bytes, so the write counts as done."""
    c = client(fault_proxy.storage_options, s3_bucket)
    fault_proxy.configure(rate=1.0, kinds=["reset_mid"], methods=["PUT"], limit=1)
    c.put("lock", b"holder=me", if_absent=True)
    assert fault_proxy.injected == {"reset_mid": 1} and c.failed_attempts >= 1
    assert c.get("lock", 100) == b"holder=me"


# --- transient faults ------------------------------------------------------------------------
def test_transient_faults_are_retried(fault_proxy, s3_bucket, caplog):
    caplog.set_level(logging.INFO, logger="uckpt.storage.s3")
    # 30% of requests fail; 10 attempts make a request that fails them all (0.3**10,
    # once in 170,000) unlikely enough for the ~60 requests here
    c = client(fault_proxy.storage_options, s3_bucket, part_bytes=5 * MiB, threads=4,
               read_timeout=10, max_attempts=10)
    data = data_of(21 * MiB, seed=3)
    fault_proxy.configure(rate=0.3, kinds=["503", "500", "reset", "reset_mid", "delay"],
                          seed=11)
    c.upload("f/big", memoryview(data), data.nbytes)
    small = {f"f/small-{i}": data[i * 1000:(i + 1) * 1000].tobytes() for i in range(20)}
    for key, value in small.items():
        c.put(key, value)
    assert c.list("f/", None).objects == {"f/big": data.nbytes, **{k: 1000 for k in small}}
    assert all(c.get(k, 1000) == v for k, v in small.items())
    assert c.crc32c_of("f/big", data.nbytes) == crc32c(data)
    out = np.zeros(data.nbytes, np.uint8)
    assert c.get_range("f/big", 0, data.nbytes, out) == data.nbytes
    assert np.array_equal(out, data)
    c.delete(list(small))
    assert c.incomplete_uploads("f/") == []
    injected = dict(fault_proxy.injected)
    assert sum(injected.values()) > 5 and c.failed_attempts > 0, injected
    assert "attempt 1 of 10 failed" in caplog.text
    # reads broken in the middle of their body are resumed where they stopped (one
    # thread reads: the same seed gives the same faults in every run)
    fault_proxy.configure(rate=0.5, kinds=["reset_mid"], methods=["GET"], seed=5)
    out[:] = 0
    assert c.get_range("f/big", 3, data.nbytes - 3, out) == data.nbytes - 3
    assert np.array_equal(out[:-3], data[3:])
    assert c.resumed_reads > 0 and "resuming" in caplog.text
    assert fault_proxy.configure(rate=0.0) is None and c.crc32c_of("f/big", data.nbytes) == crc32c(data)


def test_lost_answers_to_multipart_requests(fault_proxy, s3_bucket):
    """CreateMultipartUpload, then CompleteMultipartUpload, carried out by the store but
    their answers lost: botocore retries them, the uploads end whole, and the upload the
    first create started (an orphan) is aborted, not left behind."""
    c = client(fault_proxy.storage_options, s3_bucket, part_bytes=5 * MiB, threads=2)
    data = data_of(11 * MiB, seed=4)
    for n, (key, target) in enumerate([("o/x", "?uploads"), ("o/y", "?uploadId=")], 1):
        fault_proxy.configure(rate=1.0, kinds=["reset_mid"], methods=["POST"],
                              path_contains=target, limit=1)
        c.upload(key, data, data.nbytes)
        assert fault_proxy.injected == {"reset_mid": n}
        assert c.incomplete_uploads("o/") == []
        assert c.crc32c_of(key, data.nbytes) == crc32c(data)


def test_failed_multipart_upload_is_aborted(fault_proxy, s3_bucket):
    c = client(fault_proxy.storage_options, s3_bucket, part_bytes=5 * MiB, threads=2,
               max_attempts=2)
    fault_proxy.configure(rate=1.0, kinds=["500"], methods=["PUT"])   # every part fails
    data = data_of(12 * MiB)
    with pytest.raises(StorageUnavailableError, match="part .* of s3://.*/u/x"):
        c.upload("u/x", data, data.nbytes)
    fault_proxy.configure(rate=0.0)
    assert c.incomplete_uploads("u/") == [] and not c.exists("u/x")


def test_one_client_many_threads(s3_server, s3_bucket):
    c = client(s3_server.storage_options, s3_bucket, part_bytes=5 * MiB, threads=2)
    blobs = {f"t/{i}": data_of(1000 + (6 * MiB if i % 4 == 0 else i), seed=i) for i in range(12)}

    def round_trip(key):
        c.upload(key, blobs[key], blobs[key].nbytes)
        out = np.empty_like(blobs[key])
        return c.get_range(key, 0, out.nbytes, out) == out.nbytes and np.array_equal(out, blobs[key])

    with cf.ThreadPoolExecutor(6) as pool:
        assert all(pool.map(round_trip, blobs))
    assert sorted(c.list("t/").objects) == sorted(blobs)


# --- the server killed in the middle of an upload ----------------------------------------------
def test_server_killed_mid_upload(own_s3_server, caplog):
    caplog.set_level(logging.WARNING, logger="uckpt.storage.s3")
    bucket = own_s3_server.new_bucket()
    with FaultProxy(own_s3_server.ports["s3"], rate=1.0, kinds=["delay"], delay_s=0.3,
                    methods=["PUT"]) as slow:   # parts take a while: time to kill the server
        opts = {**own_s3_server.storage_options, "endpoint_url": slow.endpoint_url,
                "part_bytes": 5 * MiB, "threads": 2, "max_attempts": 2,
                "connect_timeout": 1, "read_timeout": 5}
        c = S3Client(bucket, opts)
        data = data_of(60 * MiB, seed=7)
        failure = []

        def upload():
            try:
                c.upload("ckpt/data-00000.bin", data, data.nbytes)
            except Exception as e:
                failure.append(e)

        t = threading.Thread(target=upload)
        t.start()
        deadline = time.monotonic() + 30
        while slow.requests < 4 and time.monotonic() < deadline:  # created, 3 parts sent
            time.sleep(0.02)
        own_s3_server.kill()
        t.join(60)
        assert not t.is_alive()
        assert len(failure) == 1 and isinstance(failure[0], StorageUnavailableError), failure
        assert "s3://" + bucket + "/ckpt/data-00000.bin" in str(failure[0])
        assert "could not abort" in caplog.text          # the server was gone
        own_s3_server.restart()
        assert not c.exists("ckpt/data-00000.bin")        # nothing visible as written
        left = c.incomplete_uploads("ckpt/")
        # SeaweedFS keeps the interrupted upload (with its parts) until it is aborted
        assert [k for k, _, _ in left] == ["ckpt/data-00000.bin"]
        assert c.abort_incomplete_uploads("ckpt/", older_than_s=3600) == 0  # too recent
        assert c.abort_incomplete_uploads("ckpt/") == 1
        assert c.incomplete_uploads("ckpt/") == [] and c.list("ckpt/", None).objects == {}
        slow.configure(rate=0.0)
        c.upload("ckpt/data-00000.bin", data, data.nbytes)
        assert c.crc32c_of("ckpt/data-00000.bin", data.nbytes) == crc32c(data)
