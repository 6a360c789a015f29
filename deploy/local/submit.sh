#!/usr/bin/env bash
# Submit `packfeed [train|serve|pack] ARGS...` as a Ray job to the local cluster and follow its
# logs (train when no subcommand is named).
#   bash deploy/local/submit.sh --config examples/train_demo.toml --output "$PWD/runs/job"
#   PACKFEED_NO_WAIT=1 bash deploy/local/submit.sh serve service/assets/corpus/*.jsonl \
#       --tokenizer service/assets/tokenizer --seq-len 2048 --port 50051
# The working directory (this repository, without .venv, runs and .git) is uploaded and the job
# runs in Ray's copy of it; relative paths (--config, inputs, --tokenizer, --output, --state-dir)
# are resolved against the directory you run this script from (passed as $PACKFEED_SUBMIT_DIR):
# the job reads and writes your files, and its .packfeed/config.json records them, never the copy.
set -euo pipefail
SUBMIT_DIR="$PWD"
source "$(dirname "$0")/env.sh"
require_cluster submit.sh
cd "$REPO"
COMMAND=train
case "${1:-}" in train|serve|pack) COMMAND=$1; shift ;; esac
RUNTIME_ENV=$(SUBMIT_DIR="$SUBMIT_DIR" python - <<'PY'
import json, os
print(json.dumps({
    "excludes": [".venv", "runs", ".git", "**/__pycache__"],
    # No usage stats; where relative output paths of the job resolve to.
    "env_vars": {"RAY_USAGE_STATS_ENABLED": "0", "PACKFEED_SUBMIT_DIR": os.environ["SUBMIT_DIR"]},
}))
PY
)
# Right after `ray start` (longer on a busy machine) the head may not have found its job agent
# yet and answers "No available agent to submit job, please try again later" before creating
# any job: retry that answer, and only that one.
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
for attempt in 1 2 3 4 5 6; do
    if ray job submit --address "$PACKFEED_JOB_ADDRESS" --working-dir . --runtime-env-json "$RUNTIME_ENV" \
        ${PACKFEED_JOB_ID:+--submission-id "$PACKFEED_JOB_ID"} ${PACKFEED_NO_WAIT:+--no-wait} \
        -- packfeed "$COMMAND" "$@" 2>&1 | tee "$LOG"; then
        exit 0
    fi
    grep -q "No available agent to submit job" "$LOG" || exit 1
    echo "job agent not ready yet (attempt $attempt); retrying in 10 s" >&2
    sleep 10
done
exit 1
