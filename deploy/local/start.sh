#!/usr/bin/env bash
# Start a single-node Ray head on 127.0.0.1 sized for this machine (all CPUs, a 1 GB object
# store), with a token of its own. Usage: bash deploy/local/start.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$PACKFEED_RAY_DIR"
if [ "$RAY_AUTH_MODE" = "token" ] && [ ! -s "$RAY_AUTH_TOKEN_PATH" ]; then
    python -c "import secrets; print(secrets.token_hex(32), end='')" > "$RAY_AUTH_TOKEN_PATH"
    chmod 600 "$RAY_AUTH_TOKEN_PATH"
fi
ray start --head --node-ip-address 127.0.0.1 --port "$PACKFEED_RAY_PORT" \
    --num-cpus "$PACKFEED_NUM_CPUS" --object-store-memory "$PACKFEED_OBJECT_STORE_BYTES" \
    --temp-dir "$PACKFEED_RAY_DIR/tmp" --include-dashboard true --dashboard-host 127.0.0.1 \
    --dashboard-port "$PACKFEED_DASHBOARD_PORT" --dashboard-agent-listen-port "$PACKFEED_AGENT_PORT" \
    --ray-client-server-port "$PACKFEED_CLIENT_PORT" \
    --disable-usage-stats
echo "cluster up: RAY_ADDRESS=$RAY_ADDRESS, jobs at $PACKFEED_JOB_ADDRESS (source deploy/local/env.sh to use it)"
