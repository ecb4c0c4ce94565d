#!/usr/bin/env bash
# The reference LM of models/, its draft heads and the study of docs/results.md, on a 2-core CPU.
#
#   benchmarks/study.sh compare   # two LM sizes side by side: one thread each, the first 10 minutes
#                                 # of a 45-minute schedule (their held-out curves: study_tables --lm)
#   benchmarks/study.sh lm        # the chosen size ($SIZE) resumed from its checkpoint on both cores
#   benchmarks/study.sh heads     # the LM's own T = 1 continuations, then seven heads, 15 minutes each,
#                                 # two at a time (one thread and one core each)
#   benchmarks/study.sh bench     # the benches of docs/results.md, one at a time, one thread
#   benchmarks/study.sh levers    # acceptance levers side by side: 2,048 on-policy records (two halves,
#                                 # one core each), then four heads, $LEVER_MINUTES each, two at a time
#   benchmarks/study.sh long      # the shipped pair's first stage, at once: copies of the FF lever run and of the winning
#                                 # BTree's ($LONG_BTREE), resumed to $LONG_MINUTES of training each
#   benchmarks/study.sh tables    # the size comparison, the heads' and the bench tables, the figure
#   benchmarks/study.sh           # all of them, in this order (about 3 hours)
#   benchmarks/study.sh --dry-run [STAGE]   # print the commands a stage would run, run none of them
#   benchmarks/study.sh --help
#
# Everything goes under $RUNS (default runs/study). The heads and benches use $MODEL (default: the LM
# that `lm` trains); to ship, copy the LM folder without checkpoint.pt to models/byte-lm and the heads'
# folders to models/heads/. Run it on a machine with nothing else running: the budgets are wall clock.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/recipe.sh  # --help, --dry-run (DRY_RUN) and run: a command, or its printed line
export OMP_WAIT_POLICY=PASSIVE  # two jobs share the two cores: no busy-waiting threads

RUNS=${RUNS:-runs/study}
SIZE=${SIZE:-d192}  # the size `compare` chose in the recorded run
declare -A SIZES=([d256]="--d-model 256 --heads 4 --ffn 704" [d192]="--d-model 192 --heads 4 --ffn 512")
LM_MINUTES=${LM_MINUTES:-45}
COMPARE_SECONDS=${COMPARE_SECONDS:-600}
MODEL=${MODEL:-$RUNS/lm-$SIZE}
HEADS=${HEADS:-$RUNS/heads}
BENCH=${BENCH:-$RUNS/bench}
DATA=$RUNS/distill-t1.jsonl
MINUTES=${MINUTES:-15}
LEVER_MINUTES=${LEVER_MINUTES:-20}
LONG_MINUTES=${LONG_MINUTES:-60}
LONG_BTREE=${LONG_BTREE:-lever-btree8-r8}  # `long`: the lever run whose BTree is extended and shipped
HALVES=("$RUNS/onpolicy-a.jsonl" "$RUNS/onpolicy-b.jsonl")  # `levers` and `long`: two seeds, one file each
STAGE=${1:-all}

lm_command() {  # size: the tiny-lm command of that size on the shared 45-minute schedule, into LM_COMMAND
    # shellcheck disable=SC2206
    LM_COMMAND=(python -m mtpc.cli tiny-lm --out "$RUNS/lm-$1" --minutes "$LM_MINUTES" --save-every 10 --seed 0
                --no-progress ${SIZES[$1]})
}

compare() {  # both sizes at once, one core each; `timeout` ends them, their checkpoints kept
    run mkdir -p "$RUNS"
    local cpu=0 pids=() size
    for size in d256 d192; do
        lm_command "$size"
        if (( DRY_RUN )); then
            run "${LM_COMMAND[@]}"
        else
            OMP_NUM_THREADS=1 taskset -c $cpu timeout "$COMPARE_SECONDS" "${LM_COMMAND[@]}" \
                > "$RUNS/lm-$size.log" 2>&1 &
            pids+=($!)
        fi
        cpu=$((cpu + 1))
    done
    (( DRY_RUN )) || wait "${pids[@]}" || true  # timeout's exit status 124 is the plan
    run python benchmarks/study_tables.py --lm "$RUNS/lm-d256" "$RUNS/lm-d192"
}

lm() {  # the chosen size goes on from where `compare` stopped it, with both cores
    lm_command "$SIZE"
    if (( DRY_RUN )); then
        run "${LM_COMMAND[@]}"
    else
        OMP_NUM_THREADS=2 "${LM_COMMAND[@]}" > "$RUNS/lm-$SIZE-resumed.log" 2>&1
    fi
}

train_head() {  # core, name, then mtpc train arguments (budget: $MINUTES)
    local cpu=$1 name=$2
    shift 2
    local command=(python -m mtpc.cli train --model "$MODEL" --out "$HEADS/$name" --minutes "$MINUTES"
                   --window-stride 2 --no-progress "$@")
    if (( DRY_RUN )); then
        run "${command[@]}"
        return
    fi
    echo "== $name: training $(date +%T)"
    OMP_NUM_THREADS=1 taskset -c "$cpu" "${command[@]}" > "$HEADS/$name.log" 2>&1 \
        || { echo "!! $name failed, see $HEADS/$name.log"; return; }
    tail -n 1 "$HEADS/$name.log"
}

FF=(--circuit examples/ff.pc -D n=8)
BTREE8=(--circuit examples/btree.pc -D n=8 -D r=8 --parameterisation shared)
ON_POLICY=(--data "$DATA" --loss kl)

queue_a() {  # core 0: the on-policy data first (the other queue starts with corpus-trained heads)
    local distill=(python -m mtpc.cli distill-data --model "$MODEL" --out "$DATA" --num-prompts 1024 --batch-size 32
                   --temperature 1 --no-progress)
    if (( DRY_RUN )); then
        run "${distill[@]}"
    else
        OMP_NUM_THREADS=1 taskset -c 0 "${distill[@]}" > "$RUNS/distill-t1.log" 2>&1
    fi
    train_head 0 ff8-kl-onpolicy "${FF[@]}" "${ON_POLICY[@]}"
    train_head 0 cp8-r8-kl-onpolicy --circuit examples/cp.pc -D n=8 -D r=8 --parameterisation shared "${ON_POLICY[@]}"
    train_head 0 btree8-r16-kl-onpolicy --circuit examples/btree.pc -D n=8 -D r=16 --parameterisation shared \
        "${ON_POLICY[@]}"
}

queue_b() {  # core 1: corpus NLL heads while the data is written, then the rest
    train_head 1 ff8-nll "${FF[@]}"
    train_head 1 btree8-r8-nll "${BTREE8[@]}"
    (( DRY_RUN )) || while [[ ! -f $DATA.meta.json ]] || pgrep -f "distill-data --model $MODEL" > /dev/null; do
        sleep 10
    done
    train_head 1 btree8-r8-kl-onpolicy "${BTREE8[@]}" "${ON_POLICY[@]}"
    train_head 1 hmm8-r8-kl-onpolicy --circuit examples/hmm.pc -D n=8 -D r=8 --parameterisation shared \
        "${ON_POLICY[@]}"
}

two_queues() {  # two queues of head trainings at once, one core each, their logs in $HEADS
    run mkdir -p "$HEADS"
    if (( DRY_RUN )); then
        "$1"
        "$2"
        return
    fi
    "$1" > "$HEADS/$1.log" 2>&1 &
    local a=$!
    "$2" > "$HEADS/$2.log" 2>&1 &
    wait $a $!
}

heads() {
    two_queues queue_a queue_b
}

halves() {  # the LM's own T = 1 continuations of 2,048 training prompts: two seeds at once, one core each
    local cpu=0 pids=() half
    for half in "${HALVES[@]}"; do
        local command=(python -m mtpc.cli distill-data --model "$MODEL" --out "$half" --num-prompts 1024
                       --batch-size 32 --temperature 1 --seed "$cpu" --no-progress)
        if (( DRY_RUN )); then
            run "${command[@]}"
        else
            OMP_NUM_THREADS=1 taskset -c $cpu "${command[@]}" > "$half.log" 2>&1 &
            pids+=($!)
        fi
        cpu=$((cpu + 1))
    done
    (( DRY_RUN )) || wait "${pids[@]}"
}

LEVER_DATA=(--data "$RUNS/onpolicy-*.jsonl" --loss kl)
BTREE8_LEVER=(--circuit examples/btree.pc -D n=8 -D r=8 --parameterisation shared "${LEVER_DATA[@]}")

levers() {  # the acceptance levers against the same BTree on the same data and budget, two at a time
    run mkdir -p "$RUNS"
    halves
    local MINUTES=$LEVER_MINUTES  # train_head's budget, for the queues below
    two_queues queue_levers_a queue_levers_b
}

lever_args() {  # a lever run's name -> its mtpc train arguments, in LEVER_ARGS
    case $1 in
        lever-btree8-r8) LEVER_ARGS=("${BTREE8_LEVER[@]}") ;;
        lever-btree8-r8-lora1) LEVER_ARGS=("${BTREE8_LEVER[@]}" --lora-layers 1) ;;
        lever-btree8-r16-factorised) LEVER_ARGS=(--circuit examples/btree.pc -D n=8 -D r=16
                                                 --parameterisation factorised "${LEVER_DATA[@]}") ;;
        lever-ff8) LEVER_ARGS=("${FF[@]}" "${LEVER_DATA[@]}") ;;
        *) echo "$0: error: LONG_BTREE=$1 is no lever run (lever-btree8-r8, -lora1, lever-btree8-r16-factorised)" >&2
           exit 2 ;;
    esac
}

lever() {  # core, lever run: trained for $LEVER_MINUTES
    lever_args "$2"
    train_head "$1" "$2" "${LEVER_ARGS[@]}"
}

queue_levers_a() {
    lever 0 lever-btree8-r8
    lever 0 lever-btree8-r16-factorised
}

queue_levers_b() {
    lever 1 lever-btree8-r8-lora1
    lever 1 lever-ff8
}

extend() {  # core, lever run, long run: a copy of the lever's run, resumed to $LONG_MINUTES in all
    lever_args "$2"
    run rm -rf "${HEADS:?}/$3"
    run cp -r "$HEADS/$2" "$HEADS/$3"
    train_head "$1" "$3" "${LEVER_ARGS[@]}"
}

long() {  # the heads to ship, FF and the winning BTree ($LONG_BTREE, a lever run's name), at once
    lever_args "$LONG_BTREE"  # refused before anything runs
    local MINUTES=$LONG_MINUTES
    two_queues long_ff long_btree
}

long_ff() {
    extend 0 lever-ff8 long-ff8
}

long_btree() {
    extend 1 "$LONG_BTREE" long-btree8
}

# The first FF head is every row's `x FF` reference: the on-policy one, as shipped.
STUDY_HEADS=(ff8-kl-onpolicy ff8-nll cp8-r8-kl-onpolicy hmm8-r8-kl-onpolicy btree8-r8-nll btree8-r8-kl-onpolicy
             btree8-r16-kl-onpolicy)
SHIPPED=(ff8-kl-onpolicy btree8-r8-kl-onpolicy)

bench_run() {  # report name, then mtpc bench arguments
    local name=$1
    shift
    local command=(python -m mtpc.cli bench --model "$MODEL" --corpus stdlib --num-prompts 6 --repeats 2
                   --max-new-tokens 256 --threads 1 --compile --no-progress --out "$BENCH/$name" "$@")
    if (( DRY_RUN )); then
        run "${command[@]}"
        return
    fi
    echo "== bench $name $(date +%T)"
    OMP_NUM_THREADS=1 "${command[@]}" > "$BENCH/$name.log" 2>&1 \
        || echo "!! mtpc bench $name exited with $? (1: a greedy output differed from plain greedy; see bench.json)"
}

bench() {
    run mkdir -p "$BENCH"
    bench_run t1 --heads "${STUDY_HEADS[@]/#/$HEADS/}" --mode sample --temperature 1 --peers prompt-lookup static
    bench_run t07 --heads "${SHIPPED[@]/#/$HEADS/}" --mode sample --temperature 0.7 --top-p 0.95 --peers prompt-lookup
    bench_run greedy --heads "${SHIPPED[@]/#/$HEADS/}" --mode greedy --lookup both --peers prompt-lookup
}

tables() {
    run python benchmarks/study_tables.py --lm "$RUNS/lm-d256" "$RUNS/lm-d192"
    run python benchmarks/study_tables.py "$BENCH/t1/bench.json" --heads
    run python benchmarks/study_figure.py "$BENCH/t1/bench.json" "$BENCH/t07/bench.json" "$BENCH/greedy/bench.json" \
        --out docs/results_tradeoff.png
}

case $STAGE in
    compare) compare ;;
    lm) lm ;;
    heads) heads ;;
    bench) bench ;;
    tables) tables ;;
    levers) levers ;;
    long) long ;;
    all) compare && lm && heads && bench && tables ;;
    *) echo "usage: $0 [--dry-run] [compare|lm|heads|bench|tables|levers|long|all]" >&2; exit 2 ;;
esac
