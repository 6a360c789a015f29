#!/usr/bin/env bash
# Stop the local cluster started by start.sh, and only it (`ray stop` would stop every Ray
# on this machine): its processes are the ones whose command line names its temp dir.
set -euo pipefail
source "$(dirname "$0")/env.sh"
python "$(dirname "$0")/stop_cluster.py" "$PACKFEED_RAY_DIR/tmp"
