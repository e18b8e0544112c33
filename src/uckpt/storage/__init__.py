"""Where checkpoint bytes live: the storage layer.

:mod:`uckpt.storage.s3` is a small synchronous client for S3-compatible object stores
(AWS S3, MinIO, Ceph, SeaweedFS, GCS through its S3 API). It needs the optional extra
``pip install 'uckpt[s3]'`` (boto3), which is imported only when an ``s3://`` URL is
used: importing this package imports nothing beyond the standard library.
"""
