#!/usr/bin/env bash
# ctest's server.* tests: makes sure the client venv exists, then runs test_server.py (or the
# script named by a first argument `--script NAME.py`, e.g. test_resident.py).
# Exits 77 (ctest: skipped) only when the venv cannot be created (no Python venv, no PyPI).
set -u
here=$(cd "$(dirname "$0")" && pwd)
if ! "$here/setup_venv.sh"; then
  echo "SKIP: could not create python/clients/.venv (python3 -m venv and PyPI are needed)"
  exit 77
fi
script=test_server.py
if [[ ${1:-} == --script ]]; then
  script=$2
  shift 2
fi
exec "$here/.venv/bin/python" "$here/$script" "$@"
