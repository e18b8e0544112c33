"""States for incremental-save tests: a table whose rows change a few at a time, so that
an incremental checkpoint refers to most of its chunks (used in-process and by
crash_saver.py), and ``save`` / ``manager`` that cut incremental saves into their chunks."""
import numpy as np

import uckpt

ROWS, COLS = 512, 256  # float32: 1 KiB a row, 512 KiB in all
CHUNK_BYTES = 8 << 10  # SaveOptions.incremental_chunk_bytes for these tests: 8 rows a chunk


def options(**kw) -> "uckpt.SaveOptions":
    """The SaveOptions of these tests (incremental chunks of CHUNK_BYTES), with ``kw``."""
    return uckpt.SaveOptions(incremental_chunk_bytes=CHUNK_BYTES, **kw)


def _layout(kw: dict) -> "uckpt.SaveOptions":
    return options(**{k: kw.pop(k) for k in ("compression", "compression_level") if k in kw})


def save(*args, **kw):
    """``uckpt.save`` with :func:`options` (``compression=`` and ``compression_level=``
    go into them)."""
    return uckpt.save(*args, options=_layout(kw), **kw)


def manager(*args, **kw) -> "uckpt.CheckpointManager":
    """``uckpt.CheckpointManager`` with :func:`options`, as :func:`save`."""
    return uckpt.CheckpointManager(*args, save_options=_layout(kw), **kw)


def table(step: int) -> np.ndarray:
    """The table after ``step`` steps: step s sets row (s * 37) % ROWS to s."""
    t = np.zeros((ROWS, COLS), np.float32)
    for s in range(1, step + 1):
        t[(s * 37) % ROWS] = s
    return t


def state(step: int, t=None) -> dict:
    return {"table": table(step) if t is None else t, "bias": np.full(7, step, np.int64),
            "step": step}


def empty_state() -> dict:
    return {"table": np.zeros((ROWS, COLS), np.float32), "bias": np.zeros(7, np.int64),
            "step": None}


def check(out: dict, step: int) -> None:
    """``out`` (what a load or restore gave) holds exactly the state of ``step``."""
    assert out["step"] == step
    assert np.array_equal(out["table"], table(step))
    assert np.array_equal(out["bias"], np.full(7, step, np.int64))
