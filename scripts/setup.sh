#!/usr/bin/env bash
# Create or update the development environment in .venv. Safe to run again:
# it reuses .venv and lets pip bring it in line with pyproject.toml.
#
#   bash scripts/setup.sh                        # from any directory
#   PYTHON=/path/to/python3.11 bash scripts/setup.sh
#
# Installs uckpt in editable mode with the extras below, pinned by
# constraints.txt. torch must stay exactly torch==2.13.0 (pinned there): the
# CPU wheel comes from pip's configured find-links; any other spec downloads
# the multi-GB CUDA build.
#
# Last, Horovod (PyTorch + MPI) is built from source by scripts/install_horovod.sh
# (a few minutes the first time; skipped when already installed). The tests of
# uckpt with Horovod need it. To leave it out: UCKPT_NO_HOROVOD=1 bash scripts/setup.sh
#
# When nothing changed since the last complete run (same constraints.txt,
# pyproject.toml, this script and scripts/install_*.sh, same UCKPT_NO_HOROVOD, and
# the venv's uckpt is this checkout's), it only says so and returns (the pip runs
# take 30-60 s even when they install nothing). --force redoes it all anyway.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Extras of uckpt to install (see [project.optional-dependencies] in
# pyproject.toml). A new framework is one more line here, e.g. `tensorflow`,
# `chainer` or `mpi`.
EXTRAS=(
    torch
    tensorflow
    chainer
    jax
    mpi
    lightning
    test
    bench
    convert
    s3
    fsspec
    fast
)
# Packages that are not an extra of uckpt but the environment needs
# (e.g. `mpich`, the MPI library that mpi4py runs on).
PACKAGES=(
    mpich
    # PEFT adapter directories converted and loaded back (tests/test_convert_peft.py)
    peft
    accelerate
    orbax-checkpoint  # Orbax interop (issue 31): reading and writing Orbax checkpoints in tests
)

VENV=.venv

run() { echo "+ $*"; "$@"; }

FORCE=0
case "${1:-}" in
    "") ;;
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument: $1" >&2; exit 2 ;;
esac

# 0. Nothing to do? The stamp holds a hash of what decides the environment; it is
# written after a complete run and removed before a new one, so a run that failed
# part-way is redone. The import check catches a venv whose editable uckpt is another
# checkout's (a venv shared by several worktrees) or that lost uckpt.
STAMP=$VENV/.uckpt-setup-stamp
inputs_hash() {
    { sha256sum constraints.txt pyproject.toml scripts/setup.sh scripts/install_*.sh
      echo "UCKPT_NO_HOROVOD=${UCKPT_NO_HOROVOD:-}"; } | sha256sum | cut -d' ' -f1
}
venv_uckpt() {
    "$VENV/bin/python" -I -c 'import os, uckpt; print(os.path.realpath(uckpt.__file__))' \
        2>/dev/null
}
if [[ $FORCE == 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$(inputs_hash)" &&
      "$(venv_uckpt)" == "$(pwd -P)/src/uckpt/__init__.py" ]]; then
    echo "setup: $VENV is up to date (nothing changed since its last setup; --force redoes it)"
    exit 0
fi
rm -f "$STAMP"

# 1. The virtual environment.
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    echo "setup: using existing $VENV ($("$VENV/bin/python" --version 2>&1))"
else
    if [[ -z "${PYTHON:-}" ]]; then
        if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
    fi
    version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ "$version" != "3.11" ]]; then
        echo "setup: warning: $PYTHON is Python $version; the pinned torch==2.13.0 CPU wheel is" \
             "built for Python 3.11 (set PYTHON=/path/to/python3.11)" >&2
    fi
    echo "setup: creating $VENV with $PYTHON (Python $version)"
    run "$PYTHON" -m venv --clear "$VENV"
fi

# 2. The packages. pip skips what is already installed at the right version; the
# editable install of uckpt itself is redone every time (a few seconds), so new
# packages or entry points in pyproject.toml are always picked up.
spec=".[$(IFS=,; echo "${EXTRAS[*]}")]"
echo "setup: installing uckpt (editable) with extras ${spec#.}, pinned by constraints.txt" \
     "(the first time this downloads packages and takes a few minutes)"
run "$VENV/bin/python" -m pip install --quiet --upgrade pip
# Chainer 7.8.1 is source-only and builds only with an older setuptools, outside
# build isolation; installed first, the `chainer` extra below finds it present.
run "$VENV/bin/python" -m pip install --quiet -c constraints.txt "setuptools>=77.0.3,<82"
run "$VENV/bin/python" -m pip install --quiet -c constraints.txt --no-build-isolation chainer==7.8.1
run "$VENV/bin/python" -m pip install --quiet -c constraints.txt -e "$spec" \
    ${PACKAGES[@]+"${PACKAGES[@]}"}

# tf_keras (Keras 2, for Horovod's TensorFlow callbacks) declares `tensorflow` as its
# dependency, which would install a second copy of TensorFlow beside tensorflow-cpu.
run "$VENV/bin/python" -m pip install --quiet -c constraints.txt --no-deps tf_keras

# DeepSpeed, for the tests of ZeRO checkpoint conversion (tests/test_convert_deepspeed.py),
# without its compiled ops (it trains on CPU with DS_ACCELERATOR=cpu and gloo).
DS_BUILD_OPS=0 run "$VENV/bin/python" -m pip install --quiet -c constraints.txt deepspeed

# 3. Horovod: PyPI has only its sdist, built here against the venv's torch (the pinned
# version in constraints.txt); the script returns at once when it is installed.
if [[ "${UCKPT_NO_HOROVOD:-}" == 1 ]]; then
    echo "setup: UCKPT_NO_HOROVOD=1: not installing Horovod (its tests will be skipped)"
else
    run bash scripts/install_horovod.sh "$VENV"
fi
inputs_hash > "$STAMP"
echo "setup: done ($VENV/bin/python)"
