"""States for incremental-save tests: a table whose rows change a few at a time, so that
an incremental checkpoint refers to most of its chunks (used in-process and by
crash_saver.py)."""
import numpy as np

ROWS, COLS = 512, 256  # float32: 1 KiB a row, 512 KiB in all
CHUNK_BYTES = 8 << 10  # knobs.incremental_chunk_bytes for these tests: 8 rows a chunk


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
