"""The records of extension ``redundancy`` (docs/format.md 13.3): which node holds which
ranks and files, its piece, and their checksums; made from and turned into the manifest's
``redundancy:*`` members, checked as the section says."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..errors import ManifestError, RedundancyConfigError
from .scheme import Redundancy, parse_redundancy, piece_size

NAME = "redundancy"
SCHEME, NODES = f"{NAME}:scheme", f"{NAME}:nodes"
_CHECKSUM = re.compile(r"crc32c:[0-9a-f]{8}")
_SCHEME = re.compile(r"partner|xor:[1-9][0-9]{0,3}")


def piece_name(node: int) -> str:
    """The file name of node ``node``'s piece."""
    return f"redundancy-{node:05d}.bin"


@dataclass(frozen=True)
class FileRecord:
    """A file of a share, or a piece: its name, size and ``crc32c:`` checksum."""

    name: str
    size: int
    checksum: str

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "size": self.size, "checksum": self.checksum}


@dataclass(frozen=True)
class NodeRecord:
    """One node: its name, its ranks, its share's files (in order) and its piece."""

    name: str
    ranks: Tuple[int, ...]
    files: Tuple[FileRecord, ...]
    piece: FileRecord

    @property
    def length(self) -> int:
        """The bytes of the share: its files' sizes added up."""
        return sum(f.size for f in self.files)

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "ranks": list(self.ranks),
                "files": [f.to_json() for f in self.files], "piece": self.piece.to_json()}


@dataclass(frozen=True)
class Records:
    """A checkpoint's redundancy: its scheme and its nodes (index = node number)."""

    scheme: Redundancy
    nodes: Tuple[NodeRecord, ...]
    step: Optional[int] = None

    @property
    def lengths(self) -> List[int]:
        return [n.length for n in self.nodes]

    def members(self) -> Dict[str, Any]:
        """The root members that declare these records (with ``{"required": false}``)."""
        return {SCHEME: str(self.scheme), NODES: [n.to_json() for n in self.nodes]}

    def describe(self, node: int) -> str:
        """``node 'name' (index i, ranks ...)``, for messages."""
        rec = self.nodes[node]
        return f"node {rec.name!r} (node {node}, ranks {_ranks(rec.ranks)})"


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else \
        f"{ranks[0]}, {ranks[1]}, ... {ranks[-1]} ({len(ranks)} ranks)"


def parse_records(doc: Mapping[str, Any], where: str = "manifest.json") -> Optional[Records]:
    """The records of a root manifest's JSON object ``doc``; None when it does not declare
    the extension. Raises :class:`~uckpt.errors.ManifestError` naming the member. (Without
    ``files`` in ``doc``, e.g. :meth:`Records.members` alone, the share files are not
    checked against the manifest's.)"""
    if NAME not in doc.get("extensions", {}):
        return None

    def fail(at: str, what: str) -> ManifestError:
        return ManifestError(f"{where}: {at}: {what} (docs/format.md 13.3)", path=where,
                             field=at, hint="no share can be rebuilt from these records: load "
                             "the checkpoint where every file is present, or from another tier")

    if doc["extensions"][NAME] != {"required": False}:
        raise fail(f"extensions[{NAME!r}]", 'must be {"required": false}')
    text = doc.get(SCHEME)
    if not isinstance(text, str) or not _SCHEME.fullmatch(text):
        raise fail(SCHEME, f'must be "partner" or "xor:G", got {text!r}')
    try:
        scheme = parse_redundancy(text)
    except RedundancyConfigError as e:
        raise fail(SCHEME, str(e).splitlines()[0]) from None
    assert scheme is not None
    entries = doc.get(NODES)
    if not isinstance(entries, list) or len(entries) < 2:
        raise fail(NODES, "must be an array of at least 2 node entries")
    sizes = {k: v.get("size") for k, v in doc.get("files", {}).items() if isinstance(v, dict)}
    sizes.update({p.get("file"): p.get("size") for p in doc.get("parts", [])
                  if isinstance(p, dict)})
    rank_of = {k: v.get("rank") for k, v in doc.get("files", {}).items() if isinstance(v, dict)}
    nodes = [_node(e, i, fail) for i, e in enumerate(entries)]
    _check_nodes(nodes, doc.get("world_size"), sizes, rank_of, fail)
    lengths = [n.length for n in nodes]
    for i, n in enumerate(nodes):
        want = piece_size(scheme, len(nodes), i, lengths)
        if n.piece.size != want:
            raise fail(f"{NODES}[{i}].piece.size", f"is {n.piece.size}, the scheme gives {want}")
    step = doc.get("step")
    return Records(scheme, tuple(nodes), step if isinstance(step, int) else None)


def _file(obj: Any, at: str, fail: Any) -> FileRecord:
    if not isinstance(obj, dict) or set(obj) != {"name", "size", "checksum"}:
        raise fail(at, "must be an object with exactly name, size, checksum")
    name, size, checksum = obj["name"], obj["size"], obj["checksum"]
    if not isinstance(name, str) or not name:
        raise fail(at + ".name", "must be a file name")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise fail(at + ".size", f"must be an integer >= 0, got {size!r}")
    if not isinstance(checksum, str) or not _CHECKSUM.fullmatch(checksum):
        raise fail(at + ".checksum", f"must be 'crc32c:' + 8 lowercase hex digits, "
                                     f"got {checksum!r}")
    return FileRecord(name, size, checksum)


def _node(obj: Any, i: int, fail: Any) -> NodeRecord:
    at = f"{NODES}[{i}]"
    if not isinstance(obj, dict) or set(obj) != {"name", "ranks", "files", "piece"}:
        raise fail(at, "must be an object with exactly name, ranks, files, piece")
    name, ranks, files = obj["name"], obj["ranks"], obj["files"]
    if not isinstance(name, str) or not 1 <= len(name) <= 255:
        raise fail(at + ".name", "must be a string of 1 to 255 characters")
    if not isinstance(ranks, list) or not ranks or \
            any(not isinstance(r, int) or isinstance(r, bool) for r in ranks) or \
            ranks != sorted(set(ranks)):
        raise fail(at + ".ranks", "must be a non-empty ascending array of distinct integers")
    if not isinstance(files, list):
        raise fail(at + ".files", "must be an array of file records")
    piece = _file(obj["piece"], at + ".piece", fail)
    if piece.name != piece_name(i):
        raise fail(at + ".piece.name", f"must be {piece_name(i)!r}, got {piece.name!r}")
    return NodeRecord(name, tuple(ranks), tuple(_file(f, f"{at}.files[{k}]", fail)
                                               for k, f in enumerate(files)), piece)


def _check_nodes(nodes: List[NodeRecord], world: Any, sizes: Dict[Any, Any],
                 rank_of: Dict[str, Any], fail: Any) -> None:
    names: Set[str] = set()
    seen_files: Set[str] = set()
    node_of: Dict[int, int] = {}
    for i, n in enumerate(nodes):
        at = f"{NODES}[{i}]"
        if n.name in names:
            raise fail(at + ".name", f"node name {n.name!r} is given twice")
        names.add(n.name)
        if i and n.ranks[0] < nodes[i - 1].ranks[0]:
            raise fail(at + ".ranks", "nodes must be ordered by their lowest rank")
        for r in n.ranks:
            if isinstance(world, int) and not 0 <= r < world:
                raise fail(at + ".ranks", f"rank {r} is not below world_size {world}")
            if r in node_of:
                raise fail(at + ".ranks", f"rank {r} is also on node {node_of[r]}")
            node_of[r] = i
        for k, f in enumerate(n.files):
            if sizes and f.name not in sizes:
                raise fail(f"{at}.files[{k}]", f"{f.name!r} is neither a data file nor a part")
            if sizes.get(f.name, f.size) != f.size:
                raise fail(f"{at}.files[{k}].size", f"{f.name!r} has size {sizes[f.name]!r} "
                                                    f"in the manifest, not {f.size}")
            if f.name in seen_files:
                raise fail(f"{at}.files[{k}]", f"{f.name!r} is in two shares")
            seen_files.add(f.name)
    if isinstance(world, int) and len(node_of) != world:
        raise fail(NODES, f"the nodes hold {len(node_of)} ranks, not world_size {world}")
    for name, rank in rank_of.items():
        held = node_of.get(rank)
        if held is not None and name not in {f.name for f in nodes[held].files}:
            raise fail(f"{NODES}[{held}].files", f"data file {name!r} of rank {rank} is not in "
                                                 "the share of that rank's node")
