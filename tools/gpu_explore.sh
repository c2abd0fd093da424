#!/usr/bin/env bash
# Whole `explore run --device "$DEVICE"` searches, run ON the GPU machine from the repository's
# root (tools/gpu_session.sh's step `explore`; its environment: PYTHONPATH set, $OUT):
#
#   1. the quick space under a budget too small for one worker: refused, exit 2, with
#      the least --memory that would do;
#   2. the quick space at that least budget with 2 workers asked: 1 fits, and it says so;
#   3. the quick space at 4 GB, 2 workers, then `explore show` (budget, planned and
#      measured peak);
#   4. the quick space stacked (budget.stack: 8, 16 trials);
#   5. a worker killed with SIGKILL in the middle of a run: the run still ends, exit 0.
#
# Every process's device memory (nvidia-smi's compute apps) is sampled every 0.5 s
# beside them into $OUT/nvsmi.csv: the budget is checked against what the driver saw.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/build/gpu}"
mkdir -p "$OUT"
W=$(mktemp -d)
cp search_spaces/quick.yaml "$W/quick.yaml"
sed -e 's/^  trials: 12/  trials: 16/' -e 's/^  workers: 2/  workers: 2\n  stack: 8/' \
    search_spaces/quick.yaml >"$W/stacked.yaml"
sed -e 's/^  rounds: 3/  rounds: 50/' -e 's/^  trials: 12/  trials: 6/' \
    search_spaces/quick.yaml >"$W/long.yaml"
DB="sqlite:///$W/gpu.db"
DEVICE="${EXPLORE_DEVICE:-gpu}"  # cpu: the script's own check, on a machine without one
BIG="${EXPLORE_MEMORY:-4GB}"
has_context() {  # has_context PID: the driver lists PID (on the CPU: PID is alive)
    if [ "$DEVICE" = gpu ]; then
        nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qx "$1"
    else
        kill -0 "$1" 2>/dev/null
    fi
}

nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_memory --format=csv \
    -lms 500 >"$OUT/nvsmi.csv" 2>/dev/null &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT

say() { echo "=== [$(date +%T)] $*"; }
ex() {  # ex NAME ARGS...: explore ARGS with a time limit, its exit status said
    local name=$1
    shift
    say "$name: explore $*"
    timeout -s INT -k 10 150 python3 -m explore.cli "$@"
    local rc=$?
    say "$name: exit $rc"
    return $rc
}

ex refused run "$W/quick.yaml" --device "$DEVICE" --memory 64MB --storage "$DB" \
    --study refused --quiet 2>&1 | tee "$W/refused.txt"
least=$(grep -oE -- '--memory [0-9.]+[KMGT]i?B is the least' "$W/refused.txt" |
        awk '{print $2}')
if [ -n "$least" ]; then
    ex least run "$W/quick.yaml" --device "$DEVICE" --memory "$least" --workers 2 \
        --storage "$DB" --study least --quiet 2>&1
else
    say "least: no least budget in the refusal above"
fi
ex quick run "$W/quick.yaml" --device "$DEVICE" --memory "$BIG" --workers 2 --storage "$DB" \
    --study quick --quiet 2>&1
ex show show --storage "$DB" --study quick 2>&1
ex stacked run "$W/stacked.yaml" --device "$DEVICE" --memory "$BIG" --workers 2 --storage "$DB" \
    --study stacked --quiet 2>&1
ex stacked_show show --storage "$DB" --study stacked 2>&1

say "kill: a worker killed with SIGKILL mid-run"
timeout -s INT -k 10 150 python3 -m explore.cli run "$W/long.yaml" --device "$DEVICE" --memory "$BIG" --workers 2 \
    --storage "$DB" --study killed --quiet >"$W/killed.txt" 2>&1 &
RUN=$!
victim=""
for _ in $(seq 1 120); do
    sleep 0.5
    driver=$(pgrep -P "$RUN" | head -1)  # timeout's child: explore run
    [ -n "$driver" ] && victim=$(pgrep -P "$driver" -f "multiprocessing.spawn" | head -1)
    if [ -n "$victim" ] && has_context "$victim"; then
        sleep 1  # let it take a trial
        break
    fi
    victim=""
done
if [ -n "$victim" ]; then
    say "kill: SIGKILL worker $victim"
    kill -9 "$victim"
else
    say "kill: no worker with a CUDA context found"
fi
wait "$RUN"
rc=$?
cat "$W/killed.txt"
say "kill: exit $rc"
ex killed_show show --storage "$DB" --study killed 2>&1
python3 - "$W/gpu.db" <<'PY'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for name, state, n in db.execute(
        "select s.study_name, t.state, count(*) from trials t join studies s "
        "using(study_id) group by 1, 2 order by 1, 2"):
    print(f"{name:10} {state:10} {n}")
# each run's budget against its measured peak, and its workers started ahead of it
for name, value in db.execute(
        "select s.study_name, a.value_json from study_user_attributes a join studies s "
        "using(study_id) where a.key = 'runs' order by 1"):
    for r in json.loads(value):
        print(f"{name:10} budget {r.get('budget')} measured peak {r.get('measured_peak')} "
              f"workers {r.get('workers')} started ahead {r.get('started_ahead')}")
PY
say "done"
