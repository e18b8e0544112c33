#!/usr/bin/env bash
# Build Horovod from its PyPI sdist (PyTorch + MPI only) into a virtual environment.
#
#   bash scripts/install_horovod.sh              # into .venv of the repository
#   bash scripts/install_horovod.sh path/to/venv
#   bash scripts/install_horovod.sh --force      # rebuild even if it is installed
#
# The version is the `horovod==` pin in constraints.txt. Does nothing when that
# version already imports (`import horovod.torch`) with MPI built in. Otherwise it
# builds (a few minutes: 2 on 2 cores; g++ and cmake 3.x >= 3.13 needed, cmake
# comes from PyPI if missing) against the venv's torch and MPI (the `mpich`
# package's mpicc/mpiexec in the venv's bin/), then checks `hvd.init()` under
# `mpiexec -n 2`. PyPI has no Horovod wheels, only the sdist, which asks for
# C++14 where torch's headers need C++17: the script patches exactly those two
# lines, and stops if they are not found (a changed sdist must not build wrong).
set -euo pipefail

FORCE=0
VENV_ARG=""
for arg in "$@"; do
    case "$arg" in
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        --force) FORCE=1 ;;
        -*) echo "install_horovod.sh: unknown option: $arg (see -h)" >&2; exit 2 ;;
        *) if [[ -n "$VENV_ARG" ]]; then
               echo "install_horovod.sh: one venv path only (see -h)" >&2; exit 2
           fi
           VENV_ARG=$arg ;;
    esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A venv given on the command line is relative to the caller's directory; the
# default is the repository's .venv, as in scripts/setup.sh.
if [[ -n "$VENV_ARG" ]]; then
    VENV=$(cd "$VENV_ARG" 2>/dev/null && pwd) || { echo "install_horovod.sh: no such directory: $VENV_ARG" >&2; exit 2; }
else
    VENV=$REPO/.venv
fi
cd "$REPO"
PY=$VENV/bin/python
CONSTRAINTS=$REPO/constraints.txt

run() { echo "+ $*"; "$@"; }
die() { echo "install_horovod: error: $*" >&2; exit 1; }

[[ -x "$PY" ]] || die "$PY not found: create the environment first (bash scripts/setup.sh)"

# The pinned version (single source of truth: constraints.txt).
SPEC=$(grep -E '^horovod==' "$CONSTRAINTS" | head -n 1 | tr -d '[:space:]') || true
[[ -n "$SPEC" ]] || die "no 'horovod==VERSION' line in $CONSTRAINTS"
VERSION=${SPEC#horovod==}

# 1. Already there? (imports horovod.torch, the pinned version, built with MPI)
CHECK='import horovod, horovod.torch as hvd; print(horovod.__version__, hvd.mpi_built())'
if [[ $FORCE == 0 ]] && have=$("$PY" -c "$CHECK" 2>/dev/null | tail -n 1); then
    if [[ "$have" == "$VERSION True" ]]; then
        echo "install_horovod: horovod $VERSION (torch, MPI) already installed in $VENV; nothing to do"
        exit 0
    fi
    echo "install_horovod: found horovod '${have% *}' (MPI built: ${have#* }) in $VENV; building $VERSION"
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
# Build requirements (no build isolation: the build must see the venv's torch).
run "$PY" -m pip install --quiet -c "$CONSTRAINTS" setuptools wheel packaging
if cmake_ok; then
    echo "install_horovod: using $(command -v cmake) ($(cmake --version | head -n 1))"
else
    echo "install_horovod: no cmake 3.x >= 3.13 on PATH; installing it from PyPI into $VENV"
    run "$PY" -m pip install --quiet -c "$CONSTRAINTS" "cmake>=3.13,<4"
    cmake_ok || die "cmake 3.x >= 3.13 still not first on PATH after pip install cmake"
fi

# 3. Download and unpack the sdist in a temporary directory (removed on exit).
TMP=$(mktemp -d "${TMPDIR:-/tmp}/uckpt-horovod.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
run "$PY" -m pip download --quiet --no-deps --no-binary :all: "$SPEC" -d "$TMP"
SDIST="$TMP/horovod-$VERSION.tar.gz"
[[ -f "$SDIST" ]] || die "pip download did not produce $SDIST (got: $(ls "$TMP"))"
run tar -xzf "$SDIST" -C "$TMP"
SRC="$TMP/horovod-$VERSION"

# 4. C++14 -> C++17, exactly one known line in each of the two files.
patch_line() {  # file, exact old line, new line (no sed metacharacters but parentheses)
    local file=$SRC/$1 n
    n=$(grep -cxF -- "$2" "$file") || true
    [[ "$n" == 1 ]] || die "expected exactly one line '$2' in $1 of horovod-$VERSION, found ${n:-0};" \
                           "the sdist changed: review the C++17 patch in $0"
    run sed -i "s/^$2\$/$3/" "$file"
    grep -qxF -- "$3" "$file" && ! grep -qxF -- "$2" "$file" || die "patching $1 failed"
}
patch_line CMakeLists.txt 'set(CMAKE_CXX_STANDARD 14)' 'set(CMAKE_CXX_STANDARD 17)'
patch_line horovod/torch/CMakeLists.txt '    set(CMAKE_CXX_STANDARD 14)' '    set(CMAKE_CXX_STANDARD 17)'

# 5. Build and install: PyTorch and MPI only.
echo "install_horovod: building horovod $VERSION (PyTorch, MPI) with $(nproc) job(s); this takes a few minutes"
start=$SECONDS
run env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS="-j$(nproc)" \
    "$PY" -m pip install --no-build-isolation --no-cache-dir -c "$CONSTRAINTS" "$SRC"
echo "install_horovod: built and installed in $((SECONDS - start)) s"

# 6. Check: two ranks under the venv's mpiexec.
run timeout 300 "$VENV/bin/mpiexec" -n 2 "$PY" -c \
    'import horovod.torch as hvd; hvd.init(); assert hvd.size() == 2 and hvd.mpi_enabled(), (hvd.size(), hvd.mpi_enabled()); print("rank", hvd.rank(), "of", hvd.size(), "ok")'
echo "install_horovod: horovod $VERSION installed in $VENV"
