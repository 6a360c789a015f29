#!/usr/bin/env bash
# Submit `packfeed train ARGS...` as a Ray job to the local cluster and follow its logs.
#   bash deploy/local/submit.sh --config examples/train_demo.toml --output "$PWD/runs/job"
# The working directory (this repository, without .venv, runs and .git) is uploaded; give
# --output as an absolute path, since the job runs in a copy of the repository.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO"
RUNTIME_ENV=$(python - <<'PY'
import json
print(json.dumps({
    "excludes": [".venv", "runs", ".git", "**/__pycache__"],
    # Train workers and packing actors log at INFO (progress lines); no usage stats.
    "env_vars": {"RAY_USAGE_STATS_ENABLED": "0"},
}))
PY
)
exec ray job submit --address "$PACKFEED_JOB_ADDRESS" --working-dir . --runtime-env-json "$RUNTIME_ENV" \
    ${PACKFEED_JOB_ID:+--submission-id "$PACKFEED_JOB_ID"} ${PACKFEED_NO_WAIT:+--no-wait} \
    -- packfeed train "$@"
