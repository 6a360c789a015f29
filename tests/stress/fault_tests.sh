#!/usr/bin/env bash
# The crash tests made deterministic by fault injection, RUNS times in a row, each run with
# another $PACKFEED_FAILURE_SEED (a server killed at a row and restarted, a packing actor dying,
# a reader failing under --exit-on-failure, a train worker dying and its restarted group needing
# rows the feeder evicted). Not part of CI: ~4 min a run on 2 cores.
#   bash tests/stress/fault_tests.sh [RUNS] [EXTRA PYTEST ARGS...]
# Prints one line per run and "N passed, M failed" at the end; exits 1 if any run failed (its
# pytest output is kept under $PACKFEED_STRESS_LOGS, default a temporary directory).
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-10}
shift || true
LOGS=${PACKFEED_STRESS_LOGS:-$(mktemp -d -t packfeed-faults-XXXX)}
TESTS=(
    "tests/integration/serve/test_serve_failures.py::test_server_killed_mid_stream_then_restarted_delivers_every_sample_once"
    "tests/integration/serve/test_serve_robustness.py::test_a_failed_reader_under_exit_on_failure_exits_1_saying_why"
    "tests/integration/pack/test_pack_cli.py::test_a_packing_actor_that_dies_is_replaced_and_the_rows_are_the_same"
    "tests/integration/train/test_train_resume.py::test_a_restarted_group_gets_rows_the_feeder_no_longer_holds"
)
passed=0
failed=0
for run in $(seq 1 "$RUNS"); do
    seed=$((1000 + run))
    log="$LOGS/run$run.log"
    start=$(date +%s)
    if PACKFEED_FAILURE_SEED=$seed .venv/bin/python -m pytest "${TESTS[@]}" -q -p no:cacheprovider \
        --basetemp="$LOGS/tmp$run" -W ignore::DeprecationWarning "$@" >"$log" 2>&1; then
        passed=$((passed + 1))
        verdict=ok
    else
        failed=$((failed + 1))
        verdict="FAILED (see $log)"
    fi
    echo "run $run (seed $seed, $(($(date +%s) - start)) s): $(tail -n 1 "$log") $verdict"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
