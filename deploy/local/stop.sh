#!/usr/bin/env bash
# Stop the local cluster started by start.sh, and only it (every other Ray on this machine keeps
# running): its processes are the ones that name its temp dir or write under it, and their
# children. Exits 1 if one survives or one of its ports stays taken.
set -euo pipefail
source "$(dirname "$0")/env.sh"
python "$(dirname "$0")/stop_cluster.py" "$PACKFEED_RAY_DIR/tmp" \
    "$PACKFEED_RAY_PORT" "$PACKFEED_DASHBOARD_PORT" "$PACKFEED_AGENT_PORT" "$PACKFEED_CLIENT_PORT"
