#!/usr/bin/env bash
# Creates .venv/ at the repository root and installs packfeed with every extra CPU machines
# can use (service, train, dev). Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -qq --upgrade pip setuptools wheel
.venv/bin/python -m pip install -qq -c constraints.txt -e ".[dev]"
# pip byte-compiles what it installs, but not the sources of an editable install: compile
# packfeed's own modules, so that a process started with PYTHONDONTWRITEBYTECODE set (every
# Ray worker, server and train rank inherits it) does not compile them again (~0.1 s a process)
.venv/bin/python -m compileall -q client service trainer
echo "packfeed installed in $(pwd)/.venv"
