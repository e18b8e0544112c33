#!/usr/bin/env bash
# Set up the environment (scripts/setup.sh), run the static checks (scripts/lint.sh:
# ruff and mypy; a failure stops here) and the test suite.
#
#   bash scripts/test.sh                         # all tests (tests/)
#   bash scripts/test.sh -k demo -x              # extra arguments go to pytest
#   UCKPT_TEST_WORKERS=1 bash scripts/test.sh    # serially, in this one process
#
# pytest runs on UCKPT_TEST_WORKERS processes (pytest-xdist; default: the cores this
# process may use, at most 2), with --dist loadgroup: tests marked with the same
# xdist_group never run at the same time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
bash scripts/lint.sh

workers=${UCKPT_TEST_WORKERS:-$(.venv/bin/python -c 'import os; print(min(2, len(os.sched_getaffinity(0))))')}
if [[ ! $workers =~ ^[1-9][0-9]*$ ]]; then
    echo "test.sh: UCKPT_TEST_WORKERS must be a whole number of processes (1: serial), not" \
         "'$workers'" >&2
    exit 2
fi
parallel=()
if (( workers > 1 )); then
    parallel=(-n "$workers" --dist loadgroup)
fi

echo "+ .venv/bin/python -m pytest -q ${parallel[*]} $*"
rc=0
.venv/bin/python -m pytest -q ${parallel[@]+"${parallel[@]}"} "$@" || rc=$?
if [[ $rc == 5 ]]; then
    # pytest's "no tests were collected": CI must never pass without running tests.
    echo "test.sh: pytest collected no tests; counting that as a failure" >&2
    exit 1
fi
exit "$rc"
