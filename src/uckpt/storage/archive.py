"""Archives of a root: where a rollback puts the steps it takes off the live line.

A rollback (:mod:`uckpt.manager.rollback`) moves the checkpoints above the step rolled back to
out of the root's live line into an *archive*: a directory (an object store: a prefix)
``rollback_NNNN`` directly under the root, itself laid out as a root
(``rollback_0001/step_00000008/...``). Their names are kept, so an archived incremental
checkpoint still finds its bases as siblings (docs/format.md section 11.4): those that
were archived with it, and those of the live line, which are linked (a local root: hard
links, else copies) or copied (an object store) into the archive first. An archive is a
root of its own: every reading tool opens it as one, and nothing the live line's
retention does reaches it.

The rollback's *intent record*, ``<root>/.uckpt-rollback.json``, is written (atomically)
before anything moves and removed once everything has: while it exists, the steps it
names are not part of the live line (:func:`hidden_steps`: ``Store.steps()`` leaves them
out), and the next writer finishes the moves before it saves. So a rollback is
all-or-nothing for every reader from the moment its record exists.
"""
from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, cast

if TYPE_CHECKING:
    from .base import Store

log = logging.getLogger("uckpt.storage.archive")

#: the intent record of a rollback in progress, at the root
INTENT_NAME = ".uckpt-rollback.json"
#: an archive directory (prefix) under the root
ARCHIVE_NAME = re.compile(r"^rollback_(\d{4,})$")
#: the largest intent record read
MAX_RECORD_BYTES = 1 << 20


def archive_name(number: int) -> str:
    return f"rollback_{number:04d}"


def encode_intent(to: int, archive: str, steps: List[int]) -> bytes:
    return json.dumps({"uckpt_rollback": 1, "to": to, "archive": archive,
                       "steps": sorted(steps)}, indent=1).encode()


def decode_intent(data: Optional[bytes], where: str) -> Optional[Dict[str, Any]]:
    """The intent record's fields, or None where there is none or it is not one uckpt
    wrote (logged: a record that cannot be read hides nothing)."""
    if data is None:
        return None
    try:
        rec = json.loads(data)
        ok = isinstance(rec, dict) and rec.get("uckpt_rollback") == 1 and \
            isinstance(rec.get("to"), int) and isinstance(rec.get("archive"), str) and \
            ARCHIVE_NAME.match(rec["archive"]) is not None and \
            isinstance(rec.get("steps"), list) and \
            all(isinstance(s, int) and not isinstance(s, bool) and s > rec["to"]
                for s in rec["steps"])
    except ValueError:
        ok = False
    if not ok:
        log.warning("ignored %s: not a rollback intent record uckpt wrote", where)
        return None
    return cast(Dict[str, Any], rec)  # a dict: `ok` checked it


def hidden_steps(store: Store) -> Set[int]:
    """The steps a rollback in progress on ``store`` takes off the live line."""
    rec = decode_intent(store.record(INTENT_NAME), f"{store.where}/{INTENT_NAME}")
    return set(rec["steps"]) if rec else set()
