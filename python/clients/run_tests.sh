#!/usr/bin/env bash
# ctest's server.openai_clients: makes sure the client venv exists, then runs test_server.py.
# Exits 77 (ctest: skipped) only when the venv cannot be created (no Python venv, no PyPI).
set -u
here=$(cd "$(dirname "$0")" && pwd)
if ! "$here/setup_venv.sh"; then
  echo "SKIP: could not create python/clients/.venv (python3 -m venv and PyPI are needed)"
  exit 77
fi
exec "$here/.venv/bin/python" "$here/test_server.py" "$@"
