#!/usr/bin/env bash
# Creates python/clients/.venv with the pinned client packages (requirements.txt: the openai
# package and Pillow) for the server tests. Does nothing when the venv already matches the pins.
# Used by scripts/setup.sh and by the ctest test server.openai_clients (run_tests.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=$here/.venv
exec 9>"$here/.venv.lock"
flock 9
if [[ -x $venv/bin/python ]] && cmp -s "$here/requirements.txt" "$venv/.requirements"; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
cp "$here/requirements.txt" "$venv/.requirements"
