"""Which format a file or directory holds: from its content, not its name.

========================  ==========================================================
format                    recognised by
========================  ==========================================================
``uckpt``                 a directory with ``manifest.json``
``dcp``                   a directory with ``.metadata`` (PyTorch Distributed Checkpoint)
``pickle``                a zip archive with ``data.pkl`` or ``<prefix>/data.pkl``
                          (``torch.save``), or a raw pickle (``\\x80`` + protocol 2-5:
                          legacy ``torch.save`` or a plain pickle)
``npz``                   a zip archive of ``.npy`` members
``hdf5``                  the HDF5 signature ``\\x89HDF\\r\\n\\x1a\\n`` at offset 0, 512,
                          1024, 2048, ... (after a user block)
``safetensors``           an 8-byte little-endian header length N <= size - 8, then ``{``
``keras``                 a zip archive with ``model.weights.h5`` (a ``.keras`` file)
``deepspeed``             a DeepSpeed checkpoint directory: ``latest`` (a root) or
                          ``mp_rank_00_model_states.pt`` or
                          ``zero_pp_rank_0_mp_rank_00_model_states.pt`` (a ``global_stepN``
                          directory), with ZeRO's ``*_optim_states.pt``
``hf``                    a Hugging Face directory (``save_pretrained``, Trainer
                          ``checkpoint-N``: ``*.index.json``, ``model.safetensors``,
                          ``pytorch_model.bin``; a PEFT adapter's
                          ``adapter_model.safetensors`` / ``.bin``) or an index file itself
``tf``                    a TensorFlow checkpoint: a prefix with ``PREFIX.index`` (or data
                          shards) beside it, an ``.index`` file (its table magic), a data
                          shard with its index, a directory with a ``checkpoint`` state file
``orbax``                 an Orbax checkpoint: a directory with ``_METADATA`` (or one item
                          subdirectory with it), or a CheckpointManager's directory of steps
========================  ==========================================================

A target is named by its extension (``.npz``, ``.pt``, ``.h5``, ``.safetensors``,
``.keras``, ``.index`` for a TensorFlow checkpoint's prefix, ...). A name without an
extension, an existing directory or a name ending in ``/`` is a uckpt checkpoint
directory; any other extension is refused (name the format with ``--to``), so
``ck.pth.tar`` never becomes a directory.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from .errors import UnknownFormatError
from . import orbax_dir, tf_prefix
from .fileio import RandomAccessFile, ZipArchive, open_regular

FORMATS = ("npz", "pickle", "hdf5", "safetensors", "uckpt", "dcp", "keras", "hf", "tf",
           "deepspeed", "orbax")
TARGETS = ("npz", "pickle", "hdf5", "safetensors", "uckpt", "keras", "hf", "tf", "deepspeed",
           "orbax")
ALIASES = {"torch": "pickle", "pt": "pickle", "pth": "pickle", "pkl": "pickle", "h5": "hdf5",
           "st": "safetensors", "huggingface": "hf", "tensorflow": "tf", "zero": "deepspeed",
           "ds": "deepspeed", "ocdbt": "orbax"}
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
EXTENSIONS = {".npz": "npz", ".pt": "pickle", ".pth": "pickle", ".pkl": "pickle",
              ".pickle": "pickle", ".bin": "pickle", ".ckpt": "pickle", ".h5": "hdf5",
              ".hdf5": "hdf5", ".hdf": "hdf5", ".safetensors": "safetensors",
              ".keras": "keras", ".index": "tf"}
#: the hint of a source whose format is not detected (sources only: a target's is --to)
_HINT = ("formats: npz, pickle (torch.save), hdf5, safetensors, uckpt, dcp, keras (.keras "
         "archives), hf (Hugging Face directories), tf (TensorFlow checkpoints: a prefix, its "
         ".index, or a directory with a 'checkpoint' file), deepspeed (ZeRO checkpoints), "
         "orbax (a directory with _METADATA, or a CheckpointManager's); name one with --from "
         "(uckpt diff: --format-a / --format-b; in Python: src_format=)")


def canonical(name: Optional[str], *, target: bool = False) -> Optional[str]:
    """The format's canonical name (``torch`` -> ``pickle``); None stays None."""
    if name is None:
        return None
    fmt = ALIASES.get(name.lower(), name.lower())
    allowed = TARGETS if target else FORMATS
    if fmt not in allowed:
        extra = " (dcp is a source only)" if fmt == "dcp" else ""
        raise UnknownFormatError(f"unknown {'target ' if target else ''}format {name!r}{extra}",
                                 hint=f"choose one of: {', '.join(allowed)}")
    return fmt


def detect(path) -> str:
    """The format of an existing file or directory, from its content."""
    p = Path(path)
    if tf_prefix.is_source(p):
        return "tf"
    if not p.exists():
        raise CheckpointNotFoundError(f"{str(p)!r} does not exist", path=str(p),
                                      hint=tf_prefix.nearby(p))
    if p.is_dir():
        if (p / "manifest.json").is_file():
            return "uckpt"
        if (p / ".metadata").is_file():
            return "dcp"
        from .hf_names import is_hf_directory

        if is_hf_directory(p):
            return "hf"
        from .deepspeed_zero import is_zero_directory

        if is_zero_directory(p):
            return "deepspeed"
        if orbax_dir.is_source(p):
            return "orbax"
        raise UnknownFormatError(f"{str(p)!r} is a directory without manifest.json (uckpt), "
                                 ".metadata (PyTorch DCP), Hugging Face weights "
                                 "(model.safetensors, pytorch_model.bin, *.index.json, a PEFT "
                                 "adapter_model.safetensors), a TensorFlow 'checkpoint' "
                                 "state file, DeepSpeed's latest / *_model_states.pt or an "
                                 "Orbax _METADATA",
                                 path=str(p), hint=_HINT)
    fd = open_regular(p)  # no FIFO or device: reading one could block forever
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 16, 0)
        if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
            return _zip_kind(p)
        for offset in [0] + [512 << i for i in range(16)]:
            if offset >= size:
                break
            if os.pread(fd, 8, offset) == HDF5_SIGNATURE:
                return "hdf5"
        if size >= 48 and tf_prefix.is_index(os.pread(fd, 8, size - 8)):
            return "tf"
    finally:
        os.close(fd)
    if len(head) >= 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if p.name.endswith(".index.json"):
        return "hf"
    raise UnknownFormatError(f"cannot tell the format of {str(p)!r} from its content",
                             path=str(p), hint=_HINT)


def _zip_kind(p: Path) -> str:
    raf = RandomAccessFile(p)
    try:
        names = list(ZipArchive(raf).members)
    except CorruptCheckpointError as e:
        raise UnknownFormatError(f"{str(p)!r} looks like a zip archive but is not readable: "
                                 f"{e.args[0]}", path=str(p)) from None
    finally:
        raf.close()
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return "pickle"
    if any(n.endswith(".npy") for n in names) or not names:
        return "npz"
    if "model.weights.h5" in names:
        return "keras"
    hint = _HINT
    raise UnknownFormatError(f"{str(p)!r} is a zip archive of neither .npy arrays (NPZ) nor a "
                             "torch.save pickle", path=str(p), hint=hint)


def target_format(path) -> str:
    """The target format named by a path: its extension; a uckpt directory when the path
    is one by intent (an existing directory, a trailing ``/``, a name without an extension);
    any other extension raises :class:`UnknownFormatError` asking for ``--to``."""
    text = os.fspath(path)
    if text.endswith(("/", os.sep)) or Path(text).is_dir():
        return "uckpt"
    name = Path(text).name.lower()
    if name.endswith(".index.json"):
        raise UnknownFormatError(
            f"{text!r}: a Hugging Face index is written with its shards into a directory",
            path=text, hint="name the directory as the target, with --to hf (and "
                            "--max-shard-size SIZE)")
    for ext, fmt in EXTENSIONS.items():
        if name.endswith(ext):
            return fmt
    suffix = Path(name).suffix
    if not suffix or not suffix[1:].isalpha():  # "ckpt", "step_100", "run.1"
        return "uckpt"
    raise UnknownFormatError(
        f"{text!r}: uckpt does not know the extension {suffix!r}, so it cannot tell which "
        "format to write", path=text,
        hint="name the format with --to (dst_format=): npz, pickle, hdf5, safetensors, keras, "
             "hf, tf, orbax or uckpt; for a uckpt checkpoint directory also end the name with '/'")
