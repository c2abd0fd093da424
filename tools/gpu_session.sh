#!/usr/bin/env bash
# The GPU session (issues 22 and 37), run ON the GPU machine from the repository's root:
#
#   bash tools/gpu_session.sh STEP...      (no STEP: every step, in the order below)
#
# Steps (each writes under $OUT, default ./build/gpu; a failing step is logged and the
# next one runs; each is bounded by its own time limit so that a call of the device
# tool, 10 minutes at most, can hold the ones it names):
#   tests        the tests that need a GPU (pytest -m gpu over the files marked gpu),
#                junit XML in tests.xml, the log in tests.log                (<= 270 s)
#   explore      tools/gpu_explore.sh: whole `explore run --device gpu` searches (refused,
#                fewer workers, 2 workers, stacked, a worker killed), explore.log, and
#                every process's device memory as the driver saw it, nvsmi.csv (<= 300 s)
#   memory       bench/gpu_memory.py, all but the onnx models: gpu_memory.json (<= 290 s)
#   memory_all   bench/gpu_memory.py, every case (onnx too), 4 side by side, each
#                counting its own device memory: gpu_memory.json             (<= 230 s)
#   first        tests, explore and memory_all side by side (none times anything, and
#                each process counts its own memory), then parallel (one run a side) and
#                cnn_step (--quick, one process a side): a first lease's whole look, in
#                about 7 minutes
#   second       first's three side by side, then cnn_step (one process a side): a
#                lease's look after fixes, in about 3 minutes
#   third        tests and memory_all side by side, parallel (one run a side), then
#                cnn_step (im2col against PyTorch's four variants, 3 processes a side):
#                about 4 minutes
#   memory_onnx  bench/gpu_memory.py, the onnx light models, residuals judged by the
#                constant of gpu_memory.json when there is one: gpu_memory_onnx.json
#                                                                            (<= 290 s)
#   parallel     bench/gpu_parallel.py (5 GB): gpu_parallel.json            (<= 290 s)
#   paper_mlp    bench/paper_mlp.py --device gpu: paper_mlp.json             (<= 240 s)
#   cnn_step     bench/cnn_step.py --device gpu --algorithms im2col (five sides, each
#                process about 7 s on an H100): cnn_step.json                (<= 240 s)
#   switching    bench/switching.py --device gpu: switching.json             (<= 100 s)
#   speed        paper_mlp cnn_step switching (under 10 minutes: a call of its own)
#   multi_model  bench/multi_model.py --device gpu --only 100:10: multi_model.json
#                (its own call: with speed's three it would pass 10 minutes) (<= 290 s)
#   peers        bench/peers.py --device gpu: explore, Optuna + PyTorch (n_jobs and a
#                journal) and Ray Tune, 4 trials at a time on the one GPU, both searches
#                at 24 trials, repeats alternating until the limit: peers.json, the
#                anytime curves' PNGs and every run's curve (peers_curves.json); explore's
#                utilisation of the device's peak is in peers.json        (<= 390 s)
#   peak         the device's float32 GEMM peak and the host's (engine.runtime.peak), and
#                the quick space's run with its utilisation line: peak.json, peak.log
#                                                                            (<= 120 s)
#   fourth       peers, then paper_mlp (5 processes a side, as long as 120 s allow):
#                a lease's look at time to a good model against the peers
#   transformer  bench/transformer.py --device gpu: the attention layers' step against
#                PyTorch CUDA and the largest batch in a budget: transformer.json, and
#                the row-wise MNIST transformer space on the GPU (transformer.log)
#                                                                            (<= 290 s)
# Every step's output and errors go to $OUT/session.log as well.  GPU_STEP_TIMEOUT
# (seconds) overrides every step's limit.  The device tool returns at most 8 files of
# $OUT per call, and empties $OUT before each: results are also copied to
# build/gpu-last/ in the working tree, which a warm machine keeps between calls.
#
# GPU_CONSTANT (bytes) gives memory_onnx and parallel the per-process constant when
# gpu_memory.json is not on this machine (a call after the machine went back).
#
# The wheels the image lacks travel in .whl/ (tools/gpu_wheels.sh fetches them; the
# device tool's carry: [".whl"]); they are installed into /tmp/site once per machine.
# Ray, for peers, travels as .ray/ray-site.tar.xz (tools/gpu_ray.sh packs it: its wheel
# alone is larger than a call carries; carry: [".whl", ".ray"]), unpacked there too.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/build/gpu}"
LAST="$PWD/build/gpu-last"
mkdir -p "$OUT" "$LAST"
LOG="$OUT/session.log"
export PYTHONUNBUFFERED=1

log() { echo "[$(date +%T)] $*" | tee -a "$LOG" >&2; }

install() {
    if [ ! -d .whl ] || ! compgen -G ".whl/*.whl" >/dev/null; then
        log "no .whl/ wheels here: run tools/gpu_wheels.sh and carry .whl"
    else
        local stamp
        stamp="/tmp/site/.installed-$(ls .whl | md5sum | cut -c1-12)"
        if [ ! -e "$stamp" ]; then
            if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --upgrade --target /tmp/site .whl/*.whl 2>&1 | tee -a "$LOG" >&2; then
                touch "$stamp"
            else
                log "installing .whl/ failed: the steps run with what the image has"
            fi
        fi
    fi
    if [ -s .ray/ray-site.tar.xz ] && [ ! -e /tmp/site/.ray-unpacked ]; then
        mkdir -p /tmp/site
        if tar -C /tmp/site -xJf .ray/ray-site.tar.xz 2>&1 | tee -a "$LOG" >&2; then
            touch /tmp/site/.ray-unpacked
        else
            log "unpacking .ray/ray-site.tar.xz failed: peers runs without Ray"
        fi
    fi
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
        python3 - <<'PY'
import importlib, sys
print("python", sys.version.split()[0])
for m in ("numpy", "cupy", "torch", "onnx", "onnxruntime", "numba", "optuna", "pydantic",
          "sqlalchemy", "pynvml", "mnist", "ray"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:
        print(m, "MISSING:", type(e).__name__, e)
PY
    } 2>&1 | tee -a "$LOG" >&2
}

# run NAME LIMIT JSON CMD...: CMD's stdout to $OUT/JSON (or the log if JSON is -), its
# stderr to the log ($STEP_LOG where set: steps run side by side keep logs of their own);
# SIGINT at the limit (pytest then still writes its report).
run() {
    local name=$1 limit=${GPU_STEP_TIMEOUT:-$2} json=$3 out=${STEP_LOG:-$LOG}
    shift 3
    log "step $name: $* (limit ${limit}s)"
    local t0=$SECONDS rc
    if [ "$json" = - ]; then
        timeout -s INT -k 20 "$limit" "$@" >>"$out" 2>&1
    else
        timeout -s INT -k 20 "$limit" "$@" >"$OUT/$json" 2>>"$out"
    fi
    rc=$?
    log "step $name: exit $rc after $((SECONDS - t0))s"
    if [ "$json" != - ] && [ -s "$OUT/$json" ]; then
        cp "$OUT/$json" "$LAST/"
    fi
    return 0
}

gpu_test_files() {
    grep -rlE 'pytest\.mark\.gpu|mark\.gpu' tests --include='test_*.py' | sort
}

# "--constant BYTES" from GPU_CONSTANT or this machine's gpu_memory.json, else nothing
constant_args() {
    local f c=${GPU_CONSTANT:-}
    for f in "$OUT/gpu_memory.json" "$LAST/gpu_memory.json"; do
        [ -n "$c" ] && break
        [ -s "$f" ] && c=$(python3 -c \
            'import json,sys; print(json.load(open(sys.argv[1]))["constant"] or "")' "$f")
    done
    [ -n "$c" ] && echo "--constant $c"
    return 0
}

step() {
    case $1 in
    tests)
        local xdist=() timeout_opt=()
        python3 -c 'import xdist' 2>/dev/null && xdist=(-n 6)
        python3 -c 'import pytest_timeout' 2>/dev/null && timeout_opt=(--timeout=240)
        # no -x: one session should show every failure, not the first
        # shellcheck disable=SC2046
        STEP_LOG="$OUT/tests.log" run tests "${TESTS_LIMIT:-270}" - python3 -m pytest -m gpu \
            -q -p no:cacheprovider "${xdist[@]}" "${timeout_opt[@]}" -rfEs \
            --junitxml="$OUT/tests.xml" $(gpu_test_files)
        [ -s "$OUT/tests.xml" ] && cp "$OUT/tests.xml" "$LAST/"
        ;;
    explore)
        STEP_LOG="$OUT/explore.log" run explore "${EXPLORE_LIMIT:-300}" - bash tools/gpu_explore.sh ;;
    memory_all)
        run memory_all "${MEMORY_LIMIT:-230}" gpu_memory.json python3 bench/gpu_memory.py --json --log \
            --jobs 4 --steps 300 --max-seconds 4 --timeout 150 --budget-s "${MEMORY_BUDGET_S:-160}" ;;
    first)
        TESTS_LIMIT=200 step tests &
        EXPLORE_LIMIT=200 step explore &
        MEMORY_LIMIT=200 MEMORY_BUDGET_S=130 step memory_all &
        wait
        PARALLEL_LIMIT=150 PARALLEL_SECONDS=4 REPEATS=1 PARALLEL_BUDGET_S=1 step parallel
        CNN_LIMIT=60 CNN_QUICK=1 REPEATS=1 step cnn_step
        ;;
    second)  # after fixes: the same look, the speed of the CNN step, no parallel
        TESTS_LIMIT=150 step tests &
        EXPLORE_LIMIT=150 step explore &
        MEMORY_LIMIT=150 MEMORY_BUDGET_S=90 step memory_all &
        wait
        CNN_LIMIT=70 REPEATS=1 step cnn_step
        ;;
    third)  # the last look: tests and memory side by side, the parallel experiment, the
        # CNN step against PyTorch's four variants (3 processes a side, im2col only)
        TESTS_LIMIT=100 step tests &
        MEMORY_LIMIT=100 MEMORY_BUDGET_S=60 step memory_all &
        wait
        PARALLEL_LIMIT=100 PARALLEL_SECONDS=4 REPEATS=1 PARALLEL_BUDGET_S=1 step parallel
        CNN_LIMIT=110 REPEATS=3 step cnn_step
        ;;
    memory)
        run memory 290 gpu_memory.json python3 bench/gpu_memory.py --json --log \
            --families mlp,cnn,stack,nn --timeout 120 --budget-s 200 ;;
    memory_onnx)
        local constant=()
        read -ra constant <<<"$(constant_args)"
        run memory_onnx 290 gpu_memory_onnx.json python3 bench/gpu_memory.py --json --log \
            --families onnx --max-seconds 8 --timeout 90 --budget-s 200 "${constant[@]}" ;;
    parallel)
        local constant=()
        read -ra constant <<<"$(constant_args)"
        run parallel "${PARALLEL_LIMIT:-290}" gpu_parallel.json python3 bench/gpu_parallel.py \
            --json --budget 5GB --seconds "${PARALLEL_SECONDS:-8}" \
            --repeats "${REPEATS:-5}" --budget-s "${PARALLEL_BUDGET_S:-200}" "${constant[@]}" ;;
    paper_mlp)
        run paper_mlp "${PAPER_LIMIT:-240}" paper_mlp.json python3 bench/paper_mlp.py --json \
            --device gpu --repeats "${REPEATS:-5}" --log ;;
    cnn_step)
        run cnn_step "${CNN_LIMIT:-240}" cnn_step.json python3 bench/cnn_step.py --json \
            --device gpu --repeats "${REPEATS:-5}" ${CNN_QUICK:+--quick} \
            --algorithms "${CNN_ALGORITHMS:-im2col}" --log ;;
    switching)
        run switching 100 switching.json python3 bench/switching.py --json --device gpu ;;
    speed)
        step paper_mlp
        step cnn_step
        step switching
        ;;
    peers)
        local sides=explore,optuna_njobs,optuna_journal
        python3 -c 'import ray' 2>/dev/null && sides="$sides,ray_tune"
        run peers "${PEERS_LIMIT:-390}" peers.json python3 bench/peers.py --json --log \
            --device gpu --workers 4 --memory 8GB --trials "${PEERS_TRIALS:-24}" \
            --repeats "${REPEATS:-3}" --sides "$sides" --timeout 200 --png "$OUT" \
            --curves "$OUT/peers_curves.json"
        cp "$OUT"/peers_*.png "$OUT/peers_curves.json" "$LAST/" 2>/dev/null
        ;;
    peak)
        run peak 60 peak.json python3 -c 'import json
from engine.runtime.peak import measure_gemm_peak as peak
print(json.dumps({"gpu_flops": peak("gpu"), "cpu_flops": peak("cpu")}))'
        STEP_LOG="$OUT/peak.log" run peak_run 60 - python3 -m explore.cli run \
            search_spaces/quick.yaml --device gpu --memory 4GB --storage "sqlite:///$OUT/peak.db"
        ;;
    fourth)
        step peers
        PAPER_LIMIT=120 step paper_mlp
        ;;
    transformer)
        run transformer "${TRANSFORMER_LIMIT:-200}" transformer.json python3 \
            bench/transformer.py --json --device gpu --repeats "${REPEATS:-5}" --log
        STEP_LOG="$OUT/transformer.log" run transformer_run 90 - python3 -m explore.cli run \
            search_spaces/transformer_rows.yaml --device gpu --memory 4GB --trials 4 \
            --storage "sqlite:///$OUT/transformer.db"
        ;;
    multi_model)
        run multi_model 290 multi_model.json python3 bench/multi_model.py --json \
            --device gpu --only 100:10 --repeats 5 ;;
    *)
        log "unknown step $1 (steps: tests explore memory memory_all memory_onnx parallel paper_mlp cnn_step switching speed multi_model peers peak transformer first second third fourth)" ;;
    esac
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests memory memory_onnx parallel speed multi_model)
log "gpu_session: ${steps[*]}; results in $OUT"
install
for s in "${steps[@]}"; do
    step "$s"
done
log "done: $(ls "$OUT" | tr '\n' ' ')"
