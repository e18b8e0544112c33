"""What a conversion may ask of its target beyond the format: compression, shards, weights kind.

:class:`WriteOptions` is checked against the target format here, once, before anything is
read, so a bad combination (``--compress`` for safetensors, ``--max-shard-size`` for NPZ)
fails at once with a message naming both.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..errors import UckptError

#: target format -> the codecs it can write (the first is what ``--compress`` alone means)
CODECS = {"npz": ("deflate",), "hdf5": ("gzip", "lzf"), "keras": ("gzip", "lzf"),
          "uckpt": ("zstd", "zstd+bytegroup")}
#: target formats that can be cut into shards (the Hugging Face layout)
SHARDABLE = ("hf", "safetensors", "pickle")
WEIGHTS = ("safetensors", "pickle")
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
DEFAULT = "default"  # ``--compress`` without a codec: the target's first


class OptionError(UckptError, ValueError):
    """An option that the target format cannot honour, or a malformed size."""


def parse_size(text) -> int:
    """``"5GB"`` -> 5 * 10**9, ``"200MiB"`` -> 200 * 2**20, ``"1000"`` -> 1000 (as
    transformers' ``max_shard_size``)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        unit = m.group(2).upper() if m else None
        if not m or unit not in _UNITS:
            raise OptionError(f"{text!r} is not a size", hint="write e.g. 5GB, 500MB, 200MiB "
                                                              "or a number of bytes")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise OptionError(f"a shard size must be at least 1 byte, not {text!r}")
    return value


@dataclass(frozen=True)
class WriteOptions:
    """``compress``: a codec name (or ``"default"``); ``max_shard_size``: bytes per shard of
    a Hugging Face layout; ``weights``: the file kind of its weights (safetensors, pickle);
    ``ranks``: the data-parallel ranks a DeepSpeed ZeRO target is partitioned for."""

    compress: Optional[str] = None
    max_shard_size: Optional[int] = None
    weights: str = "safetensors"
    ranks: Optional[int] = None

    def codec(self, fmt: str) -> Optional[str]:
        """The codec to write ``fmt`` with (None: uncompressed); raises :class:`OptionError`
        for a codec the format cannot write."""
        if self.compress is None:
            return None
        allowed = CODECS.get(fmt, ())
        if not allowed:
            raise OptionError(f"the {fmt} format cannot be compressed by uckpt convert",
                              hint="compressible targets: " + ", ".join(
                                  f"{f} ({'/'.join(c)})" for f, c in CODECS.items()))
        if self.compress == DEFAULT:
            return allowed[0]
        if self.compress not in allowed:
            raise OptionError(f"{fmt} cannot be compressed with {self.compress!r}",
                              hint=f"choose one of: {', '.join(allowed)}")
        return self.compress


def target_of(fmt: str, options: WriteOptions) -> str:
    """The format actually written: safetensors or pickle cut into shards is the Hugging Face
    layout (a directory with an index)."""
    if options.max_shard_size is not None:
        if fmt not in SHARDABLE:
            raise OptionError(f"--max-shard-size cuts Hugging Face weights into shards; the "
                              f"{fmt} format has no shards",
                              hint="use --to hf, safetensors or pickle")
        return "hf"
    return fmt


def for_target(fmt: str, options: WriteOptions) -> WriteOptions:
    """``options`` with ``weights`` set from a shardable target named by its file kind."""
    if options.weights not in WEIGHTS:
        raise OptionError(f"Hugging Face weights are safetensors or pickle, not "
                          f"{options.weights!r}")
    if fmt in WEIGHTS and options.max_shard_size is not None:
        return WriteOptions(options.compress, options.max_shard_size, fmt, options.ranks)
    if options.ranks is not None and (fmt != "deepspeed" or type(options.ranks) is not int
                                      or options.ranks < 1):
        raise OptionError(f"ranks={options.ranks!r}: a number of ranks (1 or more) is given "
                          f"for a DeepSpeed ZeRO target, not for {fmt}",
                          hint="leave ranks out, or convert --to deepspeed")
    return options
