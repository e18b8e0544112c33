"""Shared test helpers. Tests use real files under pytest's tmp_path, never fixed paths."""
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# a real S3 server (SeaweedFS) for the object-store tests: fixtures s3_server, s3_bucket, ...;
# xdist_group marks that keep their module on one worker under pytest 9.2 (xdist_groups.py)
pytest_plugins = ["s3_server", "xdist_groups"]

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# --- markers: `scripts/test.sh -m "not slow"` is the quick subset (planner, format, manifest,
# core round trips, adapters' conformance); the full suite stays the test command of the
# README and CI. Marked here, not in each file: whole modules that start processes
# (mpiexec, torchrun, training runs, the CLI on real frameworks), servers or long fuzzing,
# single slow tests by name, and every test using the S3 server's fixtures.
SLOW_MODULES = {
    "test_chainer_compat", "test_chainer_resume", "test_cli", "test_comm", "test_convert_cli",
    "test_convert_diff", "test_convert_frameworks", "test_convert_safety", "test_crash",
    "test_cuda", "test_demo", "test_distributed", "test_fuzz_checkpoint", "test_fuzz_convert",
    "test_horovod_comm", "test_horovod_train", "test_keras_distributed", "test_manifest_memory",
    "test_preemption", "test_readme", "test_rng_frameworks", "test_s3_lease", "test_s3_store",
    "test_s3_tier", "test_shared_root",
    "test_tf_adapter", "test_tf_callback", "test_tf_resume", "test_torch_dtensor",
    "test_torch_e2e", "test_torch_restart",
    # added with issues 12-18: TensorFlow imports, training runs, several processes
    "test_compress_cli", "test_compress_distributed", "test_convert_hf", "test_convert_keras",
    "test_convert_interop", "test_keras_native_layout", "test_chainer_native_layout",
    "test_torch_native_layout", "test_lightning", "test_tf_keras2", "test_horovod_tf",
    "test_incremental_dist",
    "test_shm_restart",  # issue 28: jobs on simulated nodes, SIGKILLed and restarted
    # issue 28: redundancy across nodes exchanged by 4 MPI and 4 gloo processes
    "test_exchange_multiproc",
    "test_node_kills",  # issue 28: 51 launches of mpiexec -n 4, 50 of them SIGKILLed
    # issue 28: a level with redundancy, SIGKILLed, nodes wiped, rebuilt (7 launches)
    "test_redundant_restart",
    "test_bench_levels",  # issue 28: benchmarks/bench_levels.py on 4 MPI ranks, tiny state
    "test_load_policy_keras",  # issue 29: TensorFlow's import alone takes seconds
    "test_mpich_segments",  # two mpiexec jobs of 2 ranks, one SIGKILLed
    "test_horovod_elastic",  # issue 28: horovodrun elastic (gloo), 4 workers, one SIGKILLed
    # issue 29: reads shared across ranks, mpiexec -n 4 (40 MB; the 400 MB acceptance case)
    "test_cooperative_mpi",
    "test_cast_distributed",  # issue 29: cast= on mpiexec -n 2 (4 s)
    "test_torchrun_elastic",  # issue 28: 4 torchrun agents, one killed, elastic restart as 3
    # issue 29: each test measures a fresh process handling 192 MiB (2-7 s); one converts
    # and consolidates a 6 GiB state under a 2 GiB address-space limit
    "test_memory_budgets",
    # issue 30: TensorFlow checkpoints; TensorFlow's import, Keras training, CLI processes
    "test_convert_tf_checkpoint",
    "test_convert_peft",  # issue 30: transformers and peft imports, PEFT models built
    # issue 31: JAX and Flax imports and jit compiles take seconds; the resume test runs a
    # Flax training loop in 4 processes (one and 8 CPU devices, each killed once)
    "test_jax_adapter", "test_jax_resume",
    "test_s3_server_cli",  # issue 30: the by-hand S3 endpoint started twice (SeaweedFS)
    # issue 31: Orbax checkpoints; JAX and Orbax imports, Orbax saves, CLI processes
    "test_convert_orbax",
    "test_bench_jax",  # issue 31: benchmarks/bench_jax.py, JAX + Orbax imports, tiny state
}
#: tests (node ids, or a prefix of them: a class) that take seconds in a quicker module
SLOW_TESTS = (
    # issue 30: DeepSpeed ZeRO runs on 2 CPU ranks (gloo), resumed on 1 and 3 (6 launches,
    # each 20-100 s: DeepSpeed's import dominates)
    "tests/test_convert_deepspeed.py::test_zero_checkpoint_converts_to_what_zero_to_fp32_gives",
    "tests/test_convert_deepspeed.py::test_deepspeed_resumes_the_conversion_on_other_rank_counts",
    "tests/test_convert_deepspeed.py::test_cli_converts_zero_to_uckpt_and_back_for_other_ranks",
    "tests/test_lazy_open.py::test_one_tensor_of_a_2gb_checkpoint_reads_its_chunks_and_the_manifest",
    "tests/test_select.py::test_keras_model_and_optimizer_restore_only_the_selected_leaves",
    "tests/test_select.py::test_convert_cli_select_is_repeatable",
    "tests/test_async.py::test_functional_async_error_nobody_saw_is_printed_at_exit",
    "tests/test_async.py::test_torch_training_step_right_after_async_save",
    "tests/test_async.py::test_unreported_background_failure_is_printed_at_exit",
    "tests/test_blob_stores.py::test_posix_locks_hold_across_processes",  # two interpreters
    "tests/test_shm_level.py::test_cli_ls_inspect_verify_an_shm_root",  # three CLI runs
    # two saves of 4 thread ranks each, pieces exchanged, copied to a durable tier
    "tests/test_redundant_level.py::test_every_node_commits_its_piece_and_the_records",
    "tests/test_blob_stores.py::test_posix_writer_killed_mid_object_leaves_the_old_one_whole",
    "tests/test_cli_races.py::test_verify_all_and_ls_beside_a_real_writer",  # a writer process
    "tests/test_conformance.py::TestKerasAdapters",  # TensorFlow's import alone takes seconds
    "tests/test_hostile_entries.py::test_inspect_on_an_ascii_terminal",
    "tests/test_hostile_entries.py::test_ls_deeply_nested_directory",
    "tests/test_manifest_integrity.py::test_a_few_changes_through_the_real_command",
    "tests/test_manifest_integrity.py::test_random_byte_changes_are_caught_by_load_and_verify",
    "tests/test_manifest_limits.py::test_200k_chunks_parse",
    "tests/test_xdist_groups.py::",  # pytest on two xdist workers in a subprocess
    "tests/test_format10.py::test_many_rows_round_trip",  # 200,000 rows written and read
    # each streams 1-2 GiB of a decompression bomb through Zstandard in a fresh process
    "tests/test_bounded_memory.py::test_a_decompression_bomb_is_verified_inspected_and_listed",
    "tests/test_bounded_memory.py::test_a_byte_grouped_bomb_is_verified_in_bounded_memory",
    "tests/test_bounded_memory.py::test_4_gib_declared_under_rlimit_as",
    "tests/test_bounded_memory.py::test_cli_reports_memory_refusal_without_traceback",
    "tests/test_bounded_memory.py::test_restore_falls_back_past_a_manifest_too_large_to_parse",
    # diff: two 1 GiB bombs streamed; two 256 MiB arrays saved (one compressed), then read
    "tests/test_bounded_memory.py::test_diff_of_decompression_bombs_streams_in_bounded_memory",
    "tests/test_bounded_memory.py::test_diff_of_two_large_arrays_holds_a_constant",
    "tests/test_bounded_memory.py::test_diff_names_a_flipped_bit_in_a_raw_chunk",
    # a 2 GiB .keras member copied to disk; 128 MiB saved, then consolidated in a subprocess
    "tests/test_convert_bounds.py::test_keras_weights_member_over_2_gib_is_copied_whole",
    "tests/test_convert_bounds.py::test_consolidate_holds_a_few_pieces_not_every_array",
    # issue 29: 128 MiB saved, then cast into bfloat16 in a subprocess measuring its peak
    "tests/test_load_policy.py::test_a_cast_of_a_large_array_holds_a_block_not_a_copy",
)
#: modules whose tests start several processes (marked ``multiproc`` as well)
MULTIPROC_MODULES = {"test_comm", "test_distributed", "test_horovod_comm", "test_horovod_train",
                     "test_keras_distributed", "test_torch_dtensor", "test_s3_tier",
                     "test_compress_distributed", "test_horovod_tf", "test_incremental_dist",
                     "test_shm_restart", "test_exchange_multiproc", "test_node_kills",
                     "test_redundant_restart", "test_bench_levels", "test_mpich_segments",
                     "test_horovod_elastic", "test_cooperative_mpi", "test_torchrun_elastic",
                     "test_cast_distributed"}
S3_FIXTURES = {"s3_server", "s3_bucket", "s3_options", "own_s3_server", "fault_proxy"}
MARKERS = {
    "slow": "seconds or more per test: processes, servers, fuzzing, training runs "
            "(deselect with -m 'not slow')",
    "multiproc": "starts several processes (mpiexec, torchrun)",
    "s3": "uses the SeaweedFS S3 server of tests/s3_server.py",
}


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_ignore_collect(collection_path, config):
    """With exactly ``-m "not slow"``, slow modules are not even imported (some import
    TensorFlow, which alone takes seconds)."""
    if (config.getoption("markexpr") or "").strip() == "not slow" and \
            collection_path.suffix == ".py" and collection_path.stem in SLOW_MODULES:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        fixtures = set(getattr(item, "fixturenames", ()))
        if module in SLOW_MODULES or item.nodeid.startswith(SLOW_TESTS) or \
                fixtures & S3_FIXTURES:
            item.add_marker(pytest.mark.slow)
        if module in MULTIPROC_MODULES:
            item.add_marker(pytest.mark.multiproc)
        if fixtures & S3_FIXTURES:
            item.add_marker(pytest.mark.s3)


@pytest.fixture(scope="session", autouse=True)
def no_mpich_segments_left():
    """At the end of the session (of each xdist worker), remove the MPICH segments that
    jobs started during it left and no live process holds: those of jobs started outside
    tests/multiproc.py's helpers, which remove them at each job's end."""
    import mpich_segments

    before = mpich_segments.segments()
    yield
    mpich_segments.remove_orphans(before)


@pytest.fixture(scope="session")
def saver_forks():
    """A fork server (tests/fork_server.py) that starts the crash tests' savers without a
    fresh interpreter each: ``saver_forks.popen([script, *args], stdout=PIPE)``. Stopped
    (its children not reaped yet SIGKILLed) at the end of the session."""
    from fork_server import ForkServer

    server = ForkServer.start()
    yield server
    server.stop()


@pytest.fixture
def small_chunks():
    """Save options that split arrays into many chunks, so chunking paths run on tiny
    data (pass as ``uckpt.save(..., options=small_chunks)``)."""
    import uckpt

    return uckpt.SaveOptions(chunk_bytes=256)


def mount_tmpfs(path: Path, size: str):
    """Mount a tmpfs of ``size`` (e.g. "1m") at the new directory ``path`` for a fixture
    to yield (needs root; the test is skipped where mounting is not allowed)."""
    import subprocess

    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def entries(root: Path) -> list:
    """Names under a checkpoint root, less the writer's lock file and the save-costs file
    (always there once a manager has saved to it)."""
    from uckpt.manager.costs import COSTS_NAME
    from uckpt.storage.checkpoint.lock import LOCK_NAME

    return sorted(p.name for p in root.iterdir() if p.name not in (LOCK_NAME, COSTS_NAME))


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt one byte of a file in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
