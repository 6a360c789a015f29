# Sourced by the deploy/local scripts: where the local cluster lives and how to reach it.
# Override any of these in the environment. Token authentication (on by default in Ray 2.60)
# uses a token file of this cluster's own, not ~/.ray/auth_token.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PATH="$REPO/.venv/bin:$PATH"
export PACKFEED_RAY_DIR="${PACKFEED_RAY_DIR:-/tmp/packfeed-ray}"
export PACKFEED_RAY_PORT="${PACKFEED_RAY_PORT:-6390}"
export PACKFEED_DASHBOARD_PORT="${PACKFEED_DASHBOARD_PORT:-8290}"
# The job agent's HTTP port (Ray's default, 52365, is taken by any other Ray on this machine,
# an embedded one included, and then `ray job submit` finds no agent).
export PACKFEED_AGENT_PORT="${PACKFEED_AGENT_PORT:-52390}"
# The Ray client server's port (Ray's default, 10001, would be shared with any other cluster;
# it must lie outside the worker ports, 10002-19999).
export PACKFEED_CLIENT_PORT="${PACKFEED_CLIENT_PORT:-20091}"
export PACKFEED_NUM_CPUS="${PACKFEED_NUM_CPUS:-$(nproc)}"
export PACKFEED_OBJECT_STORE_BYTES="${PACKFEED_OBJECT_STORE_BYTES:-1000000000}"
# How long `ray job stop` lets a job drain before killing it (Ray's default, 3 s, would cut a
# serve drain short); read by the job supervisor, so it must be set when the head starts.
export RAY_JOB_STOP_WAIT_TIME_S="${RAY_JOB_STOP_WAIT_TIME_S:-60}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
export RAY_AUTH_TOKEN_PATH="${RAY_AUTH_TOKEN_PATH:-$PACKFEED_RAY_DIR/auth_token}"
export RAY_ADDRESS="127.0.0.1:$PACKFEED_RAY_PORT"
export PACKFEED_JOB_ADDRESS="http://127.0.0.1:$PACKFEED_DASHBOARD_PORT"

# Exit at once with one line when no cluster answers at the job address, instead of Ray's
# timeouts (~40 s) and traceback. Usage: require_cluster SCRIPT_NAME
require_cluster() {
    if ! timeout 2 bash -c ": </dev/tcp/127.0.0.1/$PACKFEED_DASHBOARD_PORT" 2>/dev/null; then
        echo "$1: no cluster at $PACKFEED_JOB_ADDRESS; start one with bash deploy/local/start.sh" >&2
        exit 1
    fi
    if [ "$RAY_AUTH_MODE" = "token" ] && [ ! -s "$RAY_AUTH_TOKEN_PATH" ]; then
        echo "$1: a cluster answers at $PACKFEED_JOB_ADDRESS but there is no token at $RAY_AUTH_TOKEN_PATH;" \
            "set PACKFEED_RAY_DIR to the one start.sh used" >&2
        exit 1
    fi
}
