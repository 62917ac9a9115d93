#!/usr/bin/env bash
# Create python/train/.venv with the training pins (requirements.txt): the same script as the
# reference dumpers' venv, pointed at this folder.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/../ref/setup_venv.sh" "$here"
