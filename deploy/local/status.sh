#!/usr/bin/env bash
# Jobs of the local cluster: `status.sh` lists them, `status.sh ID` shows one with its logs.
# Without a cluster it says so at once (exit 1).
set -euo pipefail
source "$(dirname "$0")/env.sh"
require_cluster status.sh
if [ $# -eq 0 ]; then
    python "$(dirname "$0")/job_table.py" "$PACKFEED_JOB_ADDRESS"
else
    ray job status --address "$PACKFEED_JOB_ADDRESS" "$1"
    ray job logs --address "$PACKFEED_JOB_ADDRESS" "$1"
fi
