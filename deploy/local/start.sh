#!/usr/bin/env bash
# Start a single-node Ray cluster sized for this machine (all CPUs, a 1 GB object store), with a
# token of its own. Usage: bash deploy/local/start.sh   (stop it with bash deploy/local/stop.sh)
#
# Where it listens (Ray 2.60, `ss -ltnp` while it runs): the dashboard, which takes the jobs
# (PACKFEED_DASHBOARD_PORT), on 127.0.0.1 only. The rest is reachable from other hosts: Ray takes
# the machine's address as the node's (it maps --node-ip-address 127.0.0.1 to it, so none is
# passed), so gcs_server (PACKFEED_RAY_PORT), the raylet and the dashboard agent listen on every
# interface, and the job agent, the runtime-env agent and the client server on the machine's
# address.
# Token authentication (RAY_AUTH_MODE=token, env.sh) is what refuses other hosts: keep it on.
#
# Ray's own start-up lines go to $PACKFEED_RAY_DIR/start.log, shown only if the start fails: their
# next steps name the machine's address and a stop command for every Ray on the machine.
set -euo pipefail
source "$(dirname "$0")/env.sh"
if timeout 2 bash -c ": </dev/tcp/127.0.0.1/$PACKFEED_DASHBOARD_PORT" 2>/dev/null; then
    echo "start.sh: $PACKFEED_JOB_ADDRESS is taken (a cluster started before?): use it, stop it with" \
        "bash deploy/local/stop.sh, or set another PACKFEED_DASHBOARD_PORT" >&2
    exit 1
fi
mkdir -p "$PACKFEED_RAY_DIR"
if [ "$RAY_AUTH_MODE" = "token" ] && [ ! -s "$RAY_AUTH_TOKEN_PATH" ]; then
    python -c "import secrets; print(secrets.token_hex(32), end='')" > "$RAY_AUTH_TOKEN_PATH"
    chmod 600 "$RAY_AUTH_TOKEN_PATH"
fi
LOG="$PACKFEED_RAY_DIR/start.log"
if ! ray start --head --port "$PACKFEED_RAY_PORT" \
    --num-cpus "$PACKFEED_NUM_CPUS" --object-store-memory "$PACKFEED_OBJECT_STORE_BYTES" \
    --temp-dir "$PACKFEED_RAY_DIR/tmp" --include-dashboard true --dashboard-host 127.0.0.1 \
    --dashboard-port "$PACKFEED_DASHBOARD_PORT" --dashboard-agent-listen-port "$PACKFEED_AGENT_PORT" \
    --ray-client-server-port "$PACKFEED_CLIENT_PORT" \
    --disable-usage-stats > "$LOG" 2>&1; then
    cat "$LOG" >&2
    echo "start.sh: ray start failed (its output above, also in $LOG)" >&2
    exit 1
fi
echo "cluster up: RAY_ADDRESS=$RAY_ADDRESS, jobs at $PACKFEED_JOB_ADDRESS (source deploy/local/env.sh to use it)"
echo "jobs: bash deploy/local/submit.sh ..., bash deploy/local/status.sh; stop it with bash deploy/local/stop.sh"
