#!/usr/bin/env bash
# Create DIR/.venv and install DIR/requirements.txt's pins into it; DIR is python/ref (the
# reference dumpers) unless given (python/train/setup_venv.sh passes python/train).
# Idempotent: an existing venv whose installed versions already match requirements.txt is
# left untouched. Override the interpreter with PYTHON=/path/to/python3.11 if needed.
set -euo pipefail

here="$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")}" && pwd)"
venv="$here/.venv"
req="$here/requirements.txt"
py="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "setup_venv: creating $venv with $("$py" --version 2>&1)"
    "$py" -m venv "$venv"
fi

# Exit 0 iff every `name==version` pin in requirements.txt is installed at that version
# (a local label such as torch's "+cu132" is ignored, as pip does).
if "$venv/bin/python" - "$req" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

ok = True
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, _, want = line.partition("==")
    name, want = name.strip(), want.strip()
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have is None or have.split("+", 1)[0] != want:
        print(f"setup_venv: {name}: installed {have}, pinned {want}")
        ok = False
sys.exit(0 if ok else 1)
PY
then
    echo "setup_venv: $venv already satisfies $req; nothing to do"
else
    "$venv/bin/python" -m pip install -r "$req"
fi
