#!/usr/bin/env bash
# The PostgreSQL fault tests (kill -9 of a driver and of a worker, Ctrl-C once and
# twice, SIGTERM, SIGHUP, the server stopped, its disk full), together under `pytest -n 2`, N times in a row (issue 32:
# a fault test that passes only sometimes is a race found).  One line per run.
#
#   bash tools/pg_kill_loop.sh [N]        # default 20
set -uo pipefail
cd "$(dirname "$0")/.."
F=tests/explore/live/test_many_drivers.py
T=("$F::test_a_driver_killed_mid_run_is_taken_over[postgres]"
   "$F::test_the_only_driver_stopped_then_run_again[kill-postgres]"
   "$F::test_the_only_driver_stopped_then_run_again[interrupt-postgres]"
   "$F::test_the_only_driver_stopped_then_run_again[twice-postgres]"
   "$F::test_the_only_driver_stopped_then_run_again[again-postgres]"
   "$F::test_sigterm_and_sighup_stop_a_run_as_ctrl_c_does[terminate-postgres]"
   "$F::test_sigterm_and_sighup_stop_a_run_as_ctrl_c_does[hangup-postgres]"
   "$F::test_a_killed_worker_is_requeued_under_the_right_number[postgres]"
   "$F::test_the_database_server_stopped_mid_run_then_started_again"
   "$F::test_the_database_servers_disk_full_mid_run")
failed=0
for i in $(seq 1 "${1:-20}"); do
    s=$SECONDS
    line=$(python -m pytest -q -n 2 -p no:cacheprovider -m "slow or not slow" "${T[@]}" 2>&1 |
           grep -E "passed|failed|^FAILED" | tr '\n' ' ')
    echo "run $i: $line($((SECONDS - s)) s)"
    case $line in *failed*) failed=$((failed + 1)) ;; esac
done
echo "failed runs: $failed"
[ "$failed" -eq 0 ]
