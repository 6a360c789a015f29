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
.venv/bin/python -m pip install -qq --no-compile -c constraints.txt -e ".[dev]"
# Byte-compile what was installed and packfeed's own sources (an editable install's are not),
# so that a process started with PYTHONDONTWRITEBYTECODE set (every Ray worker, server and train
# rank inherits it) does not compile them again (~0.1 s a process for packfeed alone). pip would
# compile its installs one file at a time (~40 s of a fresh set-up); this uses every core, skips
# what is compiled already, and, as pip does, passes over the few files that are not Python 3.11
# (torch's Python 3.12 test helpers): hence the `|| true`.
.venv/bin/python -m compileall -qq -j 0 .venv/lib/python3*/site-packages client service trainer || true
echo "packfeed installed in $(pwd)/.venv"
