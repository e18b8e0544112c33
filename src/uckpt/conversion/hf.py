"""Hugging Face layouts: ``save_pretrained`` directories, sharded weights with their index,
Trainer ``checkpoint-N`` directories, and PEFT adapter directories.

Reading. The weights are ``model.safetensors.index.json`` (or ``pytorch_model.bin.index.json``)
and the shards it names, else ``model.safetensors`` (or ``pytorch_model.bin``), else a PEFT
adapter's ``adapter_model.safetensors`` (or ``adapter_model.bin``); each shard is
read by the safetensors or Pickle reader, and every name the index maps must be in its shard.
An index file itself is read as its directory's weights. A Trainer directory adds
``optimizer.pt``, ``scheduler.pt``, ``scaler.pt`` and ``rng_state*.pth``; its tree is then
``{"model": weights, "optimizer": ..., "scheduler": ..., "rng_state": ...}``, while a
``save_pretrained`` directory's tree is the flat state dict itself (the same tree as its
single weights file). Every other regular file of the directory (``config.json``,
``generation_config.json``, tokenizer files, ``trainer_state.json``, ``training_args.bin``)
is carried along, byte for byte, in ``Tree.extras[""]["hf.files"]`` (never parsed, never
unpickled), so it comes back when the target is a Hugging Face directory again.

Writing (a directory, committed atomically like any output): the weights as one file, or
cut into shards of at most ``max_shard_size`` bytes (as transformers cuts them: in order,
a new shard when the next tensor would overflow) with an index; without a
``max_shard_size``, a tree read from an index is cut at its largest shard's size, so the
index comes back with its metadata (``total_parameters``). The Trainer parts as
``torch.save`` files; the carried files as they were. A tree carrying ``adapter_config.json``
(a PEFT adapter's) gets its weights as ``adapter_model.safetensors`` (or ``.bin``), the one
file ``PeftModel.from_pretrained`` reads. Which part of a tree is the weights and which the
Trainer's: :mod:`.hf_parts`.
"""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import CorruptCheckpointError, UnsupportedObjectError
from ..format.strict_json import loads as strict_json_loads
from ..format.values import key as show_key, show
from . import safetensors_fmt, skeleton, torch_pickle, torch_writer
from .detect import detect
from .hf_names import ADAPTER_CONFIG, ADAPTER_WEIGHTS, WEIGHTS
from .hf_parts import MODEL, TRAINER, describe, split_root
from .fileio import RandomAccessFile, open_regular
from .interchange import Leaf, Obj, Tree, reading
from .options import WriteOptions
from .progress import Progress

FILES = "hf.files"  # Tree.extras[""] key: carried files, name -> {"text"} or {"base64"}
INDEX_META = "hf.index_metadata"  # Tree.extras[""] key: the index's metadata (not total_size)
#: Tree.extras[""] key: the bytes of the largest shard an index named (the target is cut so
#: again when no --max-shard-size is given, so the index and its metadata are kept)
SHARD_SIZE = "hf.shard_size"
MAX_CARRIED = 256 << 20  # carried files, in all
MAX_INDEX = 64 << 20


# -- reading -----------------------------------------------------------------------------------
def _json(path: Path, limit: int) -> Any:
    raf = RandomAccessFile(path)  # links to regular files are followed (cache snapshots)
    try:
        if raf.size > limit:
            raise CorruptCheckpointError(f"{path}: {raf.size} bytes is more than the "
                                         f"{limit} an index may have", path=str(path))
        data = raf.pread(raf.size, 0)
    finally:
        raf.close()
    try:
        return strict_json_loads(data)
    except (UnicodeError, ValueError, RecursionError) as e:
        raise CorruptCheckpointError(f"{path}: not valid JSON: {e}", path=str(path)) from None


def _member(directory: Path, name: Any, where: str) -> Path:
    """A file the index names: a plain name inside the directory, never a path out of it."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or \
            name in (".", "..") or "\0" in name:
        raise CorruptCheckpointError(f"{where}: names the shard {name!r}, which is not a file "
                                     "name in its directory", path=where)
    return directory / name


def _read_file(path: Path, tree: Tree) -> Tree:
    """One shard or Trainer file, read by its own reader, closed with ``tree``."""
    fmt = detect(path)
    if fmt not in ("safetensors", "pickle"):
        raise CorruptCheckpointError(f"{path}: a Hugging Face weights or Trainer file in the "
                                     f"{fmt} format; expected safetensors or torch.save",
                                     path=str(path))
    part = (torch_pickle if fmt == "pickle" else safetensors_fmt).read(path)
    tree.closers.append(part.close)
    tree.notes.extend(part.notes)
    return part


def _flat(part: Tree, where: str) -> Dict[str, Any]:
    root = part.root
    if not isinstance(root, dict) or not all(isinstance(k, str) for k in root):
        raise CorruptCheckpointError(f"{where}: holds a {type(root).__name__}, not a dict of "
                                     "named tensors", path=where)
    return root


def _index(index: Path) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """The ``weight_map`` (tensor name -> shard file name) and ``metadata`` of an index,
    each field checked: a field of the wrong type is a CorruptCheckpointError naming it."""
    doc = _json(index, MAX_INDEX)
    where = str(index)

    def bad(field: str, value: Any, want: str, leaf=None) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"{where}: {field} is {show(value)}, not {want}", path=where, leaf=leaf,
            hint="the index is damaged; write it again (save_pretrained), or convert the "
                 "weights file itself")

    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise CorruptCheckpointError(f"{where}: not a Hugging Face index (no weight_map)",
                                     path=where)
    weight_map = doc["weight_map"]
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise bad(f"weight_map[{show_key(name)}]", file, "the name of a shard file", name)
    meta = doc.get("metadata", {})
    if not isinstance(meta, dict):
        raise bad("metadata", meta, "an object")
    total = meta.get("total_size", 0)
    if isinstance(total, bool) or not isinstance(total, (int, float)) or not total >= 0:
        raise bad("metadata.total_size", total, "a number of bytes")
    return weight_map, meta


def _weights_from_index(index: Path, tree: Tree) -> Dict[str, Any]:
    where = str(index)
    weight_map, meta = _index(index)
    kept = {k: v for k, v in meta.items() if k != "total_size"}
    if kept:
        tree.extras.setdefault("", {})[INDEX_META] = kept
    by_file: Dict[str, List[str]] = {}
    for name, file in weight_map.items():
        by_file.setdefault(file, []).append(name)
    out: Dict[str, Any] = {}
    largest = 0
    for file, wanted in by_file.items():
        path = _member(index.parent, file, where)
        part = _read_file(path, tree)
        if not tree.extras.get("", {}).get(safetensors_fmt.META_EXTRA):
            meta = part.extras.get("", {}).get(safetensors_fmt.META_EXTRA)
            if meta:
                tree.extras.setdefault("", {})[safetensors_fmt.META_EXTRA] = meta
        stored = _flat(part, str(path))
        missing = [n for n in wanted if n not in stored]
        if missing:
            raise CorruptCheckpointError(f"{where}: maps {missing[0]!r} to {file}, which does "
                                         f"not hold it ({len(missing)} such name(s))",
                                         path=str(path), leaf=missing[0])
        unlisted = [n for n in stored if n not in weight_map]
        if unlisted:
            tree.notes.append(f"{path}: {len(unlisted)} tensor(s) the index does not name are "
                              f"skipped, as transformers skips them: {', '.join(unlisted[:5])}")
        for n in stored:
            if n in weight_map:
                out[n] = stored[n]
        largest = max(largest, sum(stored[n].nbytes for n in wanted
                                   if isinstance(stored[n], Leaf)))
    tree.extras.setdefault("", {})[SHARD_SIZE] = largest
    return {n: out[n] for n in weight_map if n in out}


def _weights(directory: Path, tree: Tree) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """The weights of a directory and the file (or index) they were read from: a model's,
    else a PEFT adapter's."""
    found, reader = [], "transformers"
    for single, index, _ in WEIGHTS.values():
        for name in (index, single):
            if (directory / name).is_file():
                found.append(name)
    if not found:
        found, reader = [n for n in ADAPTER_WEIGHTS.values() if (directory / n).is_file()], "PEFT"
    if not found:
        return None, None
    if len(found) > 1:
        tree.notes.append(f"{directory}: holds {', '.join(found)}; {found[0]} is read (as "
                          f"{reader} prefers it)")
    path = directory / found[0]
    if path.name.endswith(".index.json"):
        return _weights_from_index(path, tree), path.name
    part = _read_file(path, tree)
    meta = part.extras.get("", {})
    if meta:
        tree.extras.setdefault("", {}).update(meta)
    return _flat(part, str(path)), path.name


def _carry(directory: Path, used: set, tree: Tree) -> None:
    files: Dict[str, Dict[str, str]] = {}
    total = 0
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.name in used or entry.name.startswith(".") or not entry.is_file():
            if not entry.name.startswith(".") and entry.name not in used:
                tree.notes.append(f"{entry.path}: not a regular file; not carried along")
            continue
        fd = open_regular(entry.path)  # a cache snapshot links its files to blobs
        try:
            size = os.fstat(fd).st_size
            total += size
            if total > MAX_CARRIED:
                raise UnsupportedObjectError(
                    f"{directory}: the files besides the weights hold more than "
                    f"{MAX_CARRIED >> 20} MiB ({entry.name} and before); uckpt carries "
                    "configuration files, not data", path=str(directory),
                    hint="move large extra files out of the directory, or convert the "
                         "weights file or index alone")
            data = os.pread(fd, size, 0)
        finally:
            os.close(fd)
        try:
            files[entry.name] = {"text": data.decode("utf-8")}
        except UnicodeDecodeError:
            files[entry.name] = {"base64": base64.b64encode(data).decode("ascii")}
    if files:
        tree.extras.setdefault("", {})[FILES] = files


def read(path, fmt: str = "hf") -> Tree:
    p = Path(path)
    with reading(fmt) as tree:
        if p.is_file():  # an index file: its directory's weights, nothing else
            tree.root = _weights_from_index(p, tree)
            return tree
        weights, source = _weights(p, tree)
        used = {n for single, index, _ in WEIGHTS.values() for n in (single, index)}
        used.update({source} if source else ())
        for _, index, _ in WEIGHTS.values():
            if (p / index).is_file():
                used.update(_index(p / index)[0].values())
        parts: Dict[str, Any] = {}
        for key, name in TRAINER.items():
            if (p / name).is_file():
                parts[key] = _read_file(p / name, tree).root
                used.add(name)
        for entry in sorted(os.listdir(p)):
            if entry.startswith("rng_state_") and entry.endswith(".pth"):
                parts[entry[:-4]] = _read_file(p / entry, tree).root
                used.add(entry)
        if weights is None and not parts:
            raise CorruptCheckpointError(f"{p}: a Hugging Face directory without weights "
                                         "(model.safetensors, pytorch_model.bin, an index, "
                                         "or a PEFT adapter_model.safetensors)", path=str(p))
        tree.root = {MODEL: weights or {}, **parts} if parts else weights
        _carry(p, used, tree)
    return tree


# -- writing -----------------------------------------------------------------------------------
def _check_weights(weights: Any, lay: skeleton.Layout) -> List[Tuple[str, Leaf]]:
    if not isinstance(weights, dict):
        raise UnsupportedObjectError(
            f"Hugging Face weights are a dict of named tensors, not {describe(weights)}",
            hint="choose the state dict with --select")
    out = []
    for name, value in weights.items():
        if isinstance(value, Leaf):
            out.append((str(name), value))
        elif isinstance(value, (dict, list, tuple, Obj)):
            raise UnsupportedObjectError(
                f"Hugging Face weights are a flat dict of named tensors, but {name!r} holds "
                f"{describe(value)}", leaf=str(name),
                hint="choose the state dict with --select (see `uckpt inspect SRC`)")
        else:
            lay.notes.append(f"{name!r} is a plain value, which Hugging Face weights cannot "
                             "hold; not written")
    return out


def plan(tree: Tree) -> skeleton.Layout:
    lay = skeleton.layout(tree.root, copies=True)
    weights, _ = split_root(tree.root, lay.notes)
    _check_weights(weights, lay)
    return lay


def shards(items: List[Tuple[str, Leaf]], limit: Optional[int]) -> List[List[Tuple[str, Leaf]]]:
    """Tensors in order, a new shard when the next one would take a shard past ``limit``
    (a tensor larger than ``limit`` gets a shard of its own)."""
    out: List[List[Tuple[str, Leaf]]] = [[]]
    size = 0
    for name, leaf in items:
        if limit is not None and out[-1] and size + leaf.nbytes > limit:
            out.append([])
            size = 0
        out[-1].append((name, leaf))
        size += leaf.nbytes
    return out


def _write_part(tree: Tree, root: Any, path: Path, writer, progress: Progress) -> None:
    """One file of the directory; a safetensors shard keeps the source's ``__metadata__``
    (the carried files go beside the shards, not into each header)."""
    meta = tree.extras.get("", {}).get(safetensors_fmt.META_EXTRA)
    part = Tree(root, tree.format, extras={"": {safetensors_fmt.META_EXTRA: meta}}
                if meta and writer is safetensors_fmt else {})
    writer.write(part, writer.plan(part), path, progress)


def write(tree: Tree, lay: skeleton.Layout, directory: Path, progress: Progress,
          options: WriteOptions = WriteOptions()) -> None:
    weights, parts = split_root(tree.root)
    items = _check_weights(weights, skeleton.Layout({}))
    writer = safetensors_fmt if options.weights == "safetensors" else torch_writer
    single, index_name, pattern = WEIGHTS[options.weights]
    carried = tree.extras.get("", {}).get(FILES, {})
    limit = options.max_shard_size
    if ADAPTER_CONFIG in carried:  # a PEFT adapter: one adapter_model file, as PEFT reads it
        if limit is not None:
            raise UnsupportedObjectError(
                f"a PEFT adapter ({ADAPTER_CONFIG}) is read from one "
                f"{ADAPTER_WEIGHTS[options.weights]}, not from shards",
                hint="leave out --max-shard-size")
        single = ADAPTER_WEIGHTS[options.weights]
    elif limit is None:  # cut as the source's index cut it: the index and its metadata stay
        kept = tree.extras.get("", {}).get(SHARD_SIZE)
        limit = kept if type(kept) is int and kept > 0 else None
    cut = shards(items, limit)
    if len(cut) == 1:
        _write_part(tree, dict(cut[0]), directory / single, writer, progress)
    else:
        weight_map: Dict[str, str] = {}
        for i, shard in enumerate(cut):
            name = pattern.format(i + 1, len(cut))
            _write_part(tree, dict(shard), directory / name, writer, progress)
            weight_map.update((n, name) for n, _ in shard)
        seen, total = set(), 0
        for _, leaf in items:
            if id(leaf) not in seen:
                seen.add(id(leaf))
                total += leaf.nbytes
        meta = {**tree.extras.get("", {}).get(INDEX_META, {}), "total_size": total}
        text = json.dumps({"metadata": meta, "weight_map": weight_map}, indent=2,
                          sort_keys=True) + "\n"
        (directory / index_name).write_text(text, encoding="utf-8")
    for key, root in parts.items():
        name = TRAINER.get(key, f"{key}.pth")
        _write_part(tree, root, directory / name, torch_writer, progress)
    written = {p.name for p in directory.iterdir()}
    for name, content in carried.items():
        path = _member(directory, name, "the carried files")
        if name in written:
            continue  # e.g. a carried pytorch_model.bin.index.json of the other kind
        data = content["text"].encode("utf-8") if "text" in content else \
            base64.b64decode(content["base64"])
        path.write_bytes(data)
