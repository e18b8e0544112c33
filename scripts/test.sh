#!/usr/bin/env bash
# Set up the environment (scripts/setup.sh), run the static checks (scripts/lint.sh:
# ruff and mypy; a failure stops here) and the test suite.
#
#   bash scripts/test.sh                         # all tests (tests/)
#   bash scripts/test.sh -k demo -x              # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
bash scripts/lint.sh

echo "+ .venv/bin/python -m pytest -q $*"
rc=0
.venv/bin/python -m pytest -q "$@" || rc=$?
if [[ $rc == 5 ]]; then
    # pytest's "no tests were collected": CI must never pass without running tests.
    echo "test.sh: pytest collected no tests; counting that as a failure" >&2
    exit 1
fi
exit "$rc"
