#!/usr/bin/env bash
# Static checks, run by scripts/test.sh before the tests (and so by CI): ruff on the
# package and the adapters, mypy on src/uckpt (strict on storage/ and format/). Their
# settings are in pyproject.toml. Exits non-zero, naming the checker, when one fails.
#
#   bash scripts/lint.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

failed=()
echo "+ .venv/bin/ruff check src/uckpt adapters"
.venv/bin/ruff check src/uckpt adapters || failed+=(ruff)
echo "+ .venv/bin/mypy"
.venv/bin/mypy || failed+=(mypy)
if (( ${#failed[@]} )); then
    echo "lint.sh: FAILED: ${failed[*]} (see above; settings in pyproject.toml)" >&2
    exit 1
fi
