"""Per-chunk bytes: checksums, content hashes, codec pipelines (docs/format.md)."""
