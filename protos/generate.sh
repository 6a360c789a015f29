#!/usr/bin/env bash
# Regenerate client/v1 (packfeed.client.v1) from protos/packfeed/v1/*.proto.
# Usage: protos/generate.sh [--check]     (see protos/generate.py)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$here/../.venv/bin/python}"
[ -x "$python" ] || python=python3
exec "$python" "$here/generate.py" "$@"
