#!/usr/bin/env bash
# Build Horovod from its PyPI sdist (PyTorch + TensorFlow, MPI + Gloo) into a virtual environment.
#
#   bash scripts/install_horovod.sh              # into .venv of the repository
#   bash scripts/install_horovod.sh path/to/venv
#   bash scripts/install_horovod.sh --force      # rebuild even if it is installed
#   bash scripts/install_horovod.sh --wheel-dir DIR   # keep the built wheel in DIR
#   bash scripts/install_horovod.sh --wheel-only DIR  # build the wheel into DIR, install nothing
#
# The version is the `horovod==` pin in constraints.txt. Does nothing when that
# version already imports with MPI and Gloo built in (Gloo: what elastic mode,
# horovodrun --min-np, runs on) and both frameworks (horovod.torch and
# horovod.tensorflow) built; an older PyTorch-only or MPI-only build is rebuilt. Otherwise it builds
# a wheel (about 7 minutes on 2 cores; g++ and cmake 3.x >= 3.13 needed, cmake comes from
# PyPI if missing) against the venv's torch, tensorflow and MPI (the `mpich` package's
# mpicc/mpiexec in the venv's bin/), installs it in one `pip install --no-deps`, then runs
# an allreduce of each framework under `mpiexec -n 2`. PyPI has no Horovod wheels, only
# the sdist, which needs patches, each matched on an exact line (a changed sdist stops
# the script instead of building wrong): C++14 -> C++17 (torch's headers need 17);
# horovod/tensorflow/xla_mpi_ops.cc left out (the TensorFlow wheel lacks the highwayhash
# headers it includes; it only serves XLA-compiled Horovod ops); horovod.tensorflow.keras
# takes tf.keras's backend, not Keras 3's (its callbacks fail on Keras 3's). When the
# TensorFlow part does not build (or tensorflow is absent), the script says so and
# installs a PyTorch-only build.
set -euo pipefail

FORCE=0
VENV_ARG=""
WHEEL_DIR=""
INSTALL=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        --force) FORCE=1 ;;
        --wheel-dir|--wheel-only)
            [[ $# -ge 2 && -n "$2" ]] || { echo "install_horovod.sh: $1 needs a directory (see -h)" >&2; exit 2; }
            [[ "$1" == --wheel-only ]] && INSTALL=0
            WHEEL_DIR=$2; shift ;;
        -*) echo "install_horovod.sh: unknown option: $1 (see -h)" >&2; exit 2 ;;
        *) if [[ -n "$VENV_ARG" ]]; then
               echo "install_horovod.sh: one venv path only (see -h)" >&2; exit 2
           fi
           VENV_ARG=$1 ;;
    esac
    shift
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A venv given on the command line is relative to the caller's directory; the
# default is the repository's .venv, as in scripts/setup.sh.
if [[ -n "$VENV_ARG" ]]; then
    VENV=$(cd "$VENV_ARG" 2>/dev/null && pwd) || { echo "install_horovod.sh: no such directory: $VENV_ARG" >&2; exit 2; }
else
    VENV=$REPO/.venv
fi
if [[ -n "$WHEEL_DIR" ]]; then
    mkdir -p "$WHEEL_DIR" && WHEEL_DIR=$(cd "$WHEEL_DIR" && pwd) \
        || { echo "install_horovod.sh: cannot create wheel directory $WHEEL_DIR" >&2; exit 2; }
fi
cd "$REPO"
PY=$VENV/bin/python
CONSTRAINTS=$REPO/constraints.txt

run() { echo "+ $*"; "$@"; }
die() { echo "install_horovod: error: $*" >&2; exit 1; }
note() { echo "install_horovod: $*"; }

[[ -x "$PY" ]] || die "$PY not found: create the environment first (bash scripts/setup.sh)"

# The pinned version (single source of truth: constraints.txt).
SPEC=$(grep -E '^horovod==' "$CONSTRAINTS" | head -n 1 | tr -d '[:space:]') || true
[[ -n "$SPEC" ]] || die "no 'horovod==VERSION' line in $CONSTRAINTS"
VERSION=${SPEC#horovod==}

# TensorFlow support is wanted whenever the venv has tensorflow.
WANT_TF=0
"$PY" -c 'import tensorflow' >/dev/null 2>&1 && WANT_TF=1

# 1. Already there? (the pinned version, built with MPI, horovod.torch importable, and
#    horovod.tensorflow too when tensorflow is installed: a PyTorch-only build from
#    before is rebuilt).
CHECK='import horovod, horovod.torch as hvd; print(horovod.__version__, hvd.mpi_built() and hvd.gloo_built())'
# (and horovod.tensorflow.keras patched for tf.keras's backend, see 4. below)
CHECK_TF='import horovod.tensorflow as hvd, horovod.tensorflow.keras as k
print(hvd.mpi_built() and "K = keras.backend" in open(k.__file__).read())'
if [[ $FORCE == 0 && $INSTALL == 1 ]] && have=$("$PY" -c "$CHECK" 2>/dev/null | tail -n 1); then
    if [[ "$have" == "$VERSION True" ]]; then
        if [[ $WANT_TF == 0 ]]; then
            note "horovod $VERSION (torch, MPI) already installed in $VENV; nothing to do (no tensorflow in the venv)"
            exit 0
        fi
        if [[ "$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c "$CHECK_TF" 2>/dev/null | tail -n 1)" == True ]]; then
            note "horovod $VERSION (torch, tensorflow, MPI) already installed in $VENV; nothing to do"
            exit 0
        fi
        note "found horovod $VERSION in $VENV without TensorFlow support; rebuilding with it"
    else
        note "found horovod '${have% *}' (MPI and Gloo built: ${have#* }) in $VENV; building $VERSION"
    fi
fi

# 2. What the build needs.
"$PY" -c 'import torch' 2>/dev/null || die "torch is not installed in $VENV (bash scripts/setup.sh first)"
for tool in mpicc mpicxx mpiexec; do
    [[ -x "$VENV/bin/$tool" ]] || die "$VENV/bin/$tool not found: Horovod is built against the venv's MPI" \
                                      "(pip install -c constraints.txt mpich)"
done
command -v c++ >/dev/null 2>&1 || die "no C++ compiler (c++) on PATH; install g++"
# The venv's bin first: CMake's FindMPI then picks the venv's mpicc/mpicxx, and a
# cmake installed from PyPI into the venv is found.
export PATH="$VENV/bin:$PATH"
# cmake 3.13 to 3.x: Horovod 0.28.1 predates CMake 4, which refuses CMakeLists that ask
# for less than 3.5 (its bundled Gloo does); untested with CMake 4, so not used.
cmake_ok() {
    local v
    v=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p') || return 1
    [[ -n "$v" ]] && printf '3.13\n%s\n3.999\n' "$v" | sort -V -C
}
# Build requirements (no build isolation: the build must see the venv's torch and
# tensorflow); pip is asked only for what is missing.
if ! "$PY" -c 'import setuptools, wheel, packaging' 2>/dev/null; then
    run "$PY" -m pip install --quiet -c "$CONSTRAINTS" setuptools wheel packaging
fi
if cmake_ok; then
    note "using $(command -v cmake) ($(cmake --version | head -n 1))"
else
    note "no cmake 3.x >= 3.13 on PATH; installing it from PyPI into $VENV"
    run "$PY" -m pip install --quiet -c "$CONSTRAINTS" "cmake>=3.13,<4"
    cmake_ok || die "cmake 3.x >= 3.13 still not first on PATH after pip install cmake"
fi

# 3. Download the sdist in a temporary directory (removed on exit).
TMP=$(mktemp -d "${TMPDIR:-/tmp}/uckpt-horovod.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
run "$PY" -m pip download --quiet --no-deps --no-binary :all: "$SPEC" -d "$TMP"
SDIST="$TMP/horovod-$VERSION.tar.gz"
[[ -f "$SDIST" ]] || die "pip download did not produce $SDIST (got: $(ls "$TMP"))"

# 4. Unpack into a fresh directory and patch: each patch replaces exactly one known
#    line, and stops the script if that line is not there exactly once.
patch_line() {  # source dir, file, exact old line, new line
    local file=$1/$2
    echo "+ patch $2: '$3' -> '$4'"
    "$PY" - "$file" "$3" "$4" <<'PATCH' || die "the sdist changed: review the patches in $0"
import sys
path, old, new = sys.argv[1:]
with open(path) as f:
    lines = f.read().split("\n")
hits = [i for i, line in enumerate(lines) if line == old]
if len(hits) != 1:
    sys.exit(f"install_horovod: error: expected exactly one line {old!r} in {path}, found {len(hits)}")
lines[hits[0]] = new
with open(path, "w") as f:
    f.write("\n".join(lines))
PATCH
}
unpack() {  # destination directory; prints the patched source tree
    local dest=$1 src
    mkdir -p "$dest" && tar -xzf "$SDIST" -C "$dest" >&2
    src=$dest/horovod-$VERSION
    {
        patch_line "$src" CMakeLists.txt 'set(CMAKE_CXX_STANDARD 14)' 'set(CMAKE_CXX_STANDARD 17)'
        patch_line "$src" horovod/torch/CMakeLists.txt '    set(CMAKE_CXX_STANDARD 14)' '    set(CMAKE_CXX_STANDARD 17)'
        patch_line "$src" horovod/tensorflow/CMakeLists.txt \
            'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")' \
            '# xla_mpi_ops.cc left out by uckpt scripts/install_horovod.sh (needs headers the TensorFlow wheel lacks)'
        # Keras: the backend of tf.keras (tf_keras under TF_USE_LEGACY_KERAS=1, what
        # horovod.tensorflow.keras works with), not the top-level Keras 3 package's,
        # which lacks get_value/set_value/constant that Horovod's callbacks call.
        local f
        for f in horovod/tensorflow/keras/__init__.py horovod/tensorflow/keras/callbacks.py; do
            patch_line "$src" "$f" '    from keras import backend as K' \
                '    K = keras.backend  # tf.keras: tf_keras under TF_USE_LEGACY_KERAS=1 (uckpt install_horovod.sh)'
        done
    } >&2
    echo "$src"
}

# 5. Build a wheel (one attempt with TensorFlow, then PyTorch only if that fails), so
#    that the venv's horovod is replaced in one short `pip install` at the end.
WHEELS=${WHEEL_DIR:-$TMP/wheels}
build_wheel() {  # source dir, then HOROVOD_* settings for the frameworks
    local src=$1; shift
    rm -f "$WHEELS"/horovod-"$VERSION"-*.whl
    run env "$@" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_MPI=1 \
            HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel --no-deps --no-build-isolation --no-cache-dir -w "$WHEELS" "$src"
}
start=$SECONDS
HAVE_TF=0
if [[ $WANT_TF == 1 ]]; then
    note "building horovod $VERSION (PyTorch, TensorFlow, MPI) with $(nproc) job(s); this takes several minutes"
    if build_wheel "$(unpack "$TMP/tf")" HOROVOD_WITH_TENSORFLOW=1; then
        HAVE_TF=1
    else
        echo "install_horovod: WARNING: the TensorFlow part of horovod $VERSION did not build against" \
             "this tensorflow ($("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null));" \
             "the errors are above. Building PyTorch only: horovod.tensorflow will not be available" \
             "and its tests are skipped." >&2
    fi
else
    note "tensorflow is not installed in $VENV: building horovod $VERSION for PyTorch only"
fi
if [[ $HAVE_TF == 0 ]]; then
    build_wheel "$(unpack "$TMP/torch")" HOROVOD_WITHOUT_TENSORFLOW=1 \
        || die "building horovod $VERSION for PyTorch failed (errors above)"
fi
WHEEL=$(ls "$WHEELS"/horovod-"$VERSION"-*.whl 2>/dev/null | head -n 1)
[[ -n "$WHEEL" ]] || die "pip wheel produced no horovod-$VERSION wheel in $WHEELS"
note "built $WHEEL in $((SECONDS - start)) s"
if [[ $INSTALL == 0 ]]; then
    note "--wheel-only: not installing; install with: $PY -m pip install -c constraints.txt $WHEEL"
    exit 0
fi
# Horovod's own runtime dependencies first (pinned; a fresh venv lacks cloudpickle), then the
# wheel alone, so that replacing an installed Horovod takes one short step.
run "$PY" -m pip install --quiet -c "$CONSTRAINTS" cloudpickle psutil pyyaml packaging cffi
run "$PY" -m pip install --no-deps --force-reinstall "$WHEEL"

# 6. Check: an allreduce of each framework on two ranks under the venv's mpiexec.
run timeout 300 "$VENV/bin/mpiexec" -n 2 "$PY" -c '
import horovod.torch as hvd, torch
hvd.init()
assert hvd.size() == 2 and hvd.mpi_enabled(), (hvd.size(), hvd.mpi_enabled())
assert hvd.gloo_built(), "built without Gloo (elastic mode needs it)"
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
assert total.item() == 3.0, total
print("horovod.torch: rank", hvd.rank(), "of", hvd.size(), "ok")'
if [[ $HAVE_TF == 1 ]]; then
    run env TF_CPP_MIN_LOG_LEVEL=2 timeout 300 "$VENV/bin/mpiexec" -n 2 "$PY" -c '
import horovod.tensorflow as hvd, tensorflow as tf
hvd.init()
assert hvd.size() == 2 and hvd.mpi_enabled(), (hvd.size(), hvd.mpi_enabled())
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
assert float(total[0]) == 3.0, total
print("horovod.tensorflow: rank", hvd.rank(), "of", hvd.size(), "ok")'
    note "horovod $VERSION (PyTorch, TensorFlow, MPI) installed in $VENV"
else
    note "horovod $VERSION (PyTorch, MPI; no TensorFlow) installed in $VENV"
fi
