#!/usr/bin/env bash
# The expressiveness-latency study of docs/results.md: train draft heads on the tiny byte LM, then
# measure them with `mtpc bench` (greedy and sampling, plain vs bonus-conditioned drafting, greedy
# draft strategies), and draw the figure.
#
#   benchmarks/study.sh train    # heads into $HEADS (skips heads already trained; resumes cut runs)
#   benchmarks/study.sh bench    # bench reports into $BENCH, figure into docs/
#   benchmarks/study.sh extra    # only the second-pass runs (greedy-64, sample-bf16) and the figure
#   benchmarks/study.sh distilled  # heads trained on the LM's own continuations, and their benches
#   benchmarks/study.sh shared   # BTree heads with the shared (cheap) parameterisation, and their benches
#   benchmarks/study.sh          # everything
#   benchmarks/study.sh --dry-run [STAGE]   # print the commands a stage would run, run none of them
#   benchmarks/study.sh --help
#
# Needs the LM first:  mtpc tiny-lm --out runs/tiny-lm
# Every head gets the same wall-clock training budget ($MINUTES) on this machine's CPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY_RUN=0
case ${1:-} in
    -h|--help|help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    --dry-run) DRY_RUN=1; shift ;;
esac
export OMP_WAIT_POLICY=PASSIVE  # other processes share the cores: no busy-waiting threads

MODEL=${MODEL:-runs/tiny-lm}
HEADS=${HEADS:-runs/heads}
BENCH=${BENCH:-runs/bench}
MINUTES=${MINUTES:-3}
TRAIN_ARGS=${TRAIN_ARGS:-"--window-stride 8"}  # score every 8th window: more text per step in a short budget
THREADS=${THREADS:-1}  # batch-1 decoding of a 3M-parameter LM: one thread, immune to other load
PROMPTS=(--corpus stdlib --prompt-len 128 --num-prompts 4 --repeats 3 --max-new-tokens 256)
STAGE=${1:-all}

run() {  # a command of the study: run it, or with --dry-run print it (shell-quoted, one line)
    if (( DRY_RUN )); then
        printf '%q ' "$@" | sed 's/ $//'
        echo
    else
        "$@"
    fi
}

train_head() {  # name, then mtpc train arguments
    local name=$1
    shift
    if (( ! DRY_RUN )) && [[ -f $HEADS/$name/train_config.json ]]; then
        echo "== $name: already trained"
        return
    fi
    local budget=(--minutes "$MINUTES")
    [[ " $* " == *" --steps "* ]] && budget=()  # a head given a fixed number of steps
    # shellcheck disable=SC2086
    local command=(python -m mtpc.cli train --model "$MODEL" --out "$HEADS/$name" "${budget[@]}" $TRAIN_ARGS
                   --no-progress "$@")
    if (( DRY_RUN )); then
        run "${command[@]}"
        return
    fi
    echo "== $name: training (${budget[*]:-fixed steps}) $(date +%T)"
    "${command[@]}" >"$HEADS/$name.log" 2>&1 || { echo "!! $name failed, see $HEADS/$name.log"; return; }
    tail -n 1 "$HEADS/$name.log"
}

# In priority order: n=8 structures, n=16 FF/BTree, the rest of n=16, the r sweep, then LoRA.
HEAD_PLAN=(
    "ff8       --circuit examples/ff.pc    -D n=8"
    "cp8-r8    --circuit examples/cp.pc    -D n=8  -D r=8"
    "hmm8-r8   --circuit examples/hmm.pc   -D n=8  -D r=8"
    "btree8-r8 --circuit examples/btree.pc -D n=8  -D r=8"
    "ff16      --circuit examples/ff.pc    -D n=16"
    "btree16-r8 --circuit examples/btree.pc -D n=16 -D r=8"
    "cp16-r8   --circuit examples/cp.pc    -D n=16 -D r=8"
    "hmm16-r8  --circuit examples/hmm.pc   -D n=16 -D r=8"
    "cp8-r1    --circuit examples/cp.pc    -D n=8  -D r=1"
    "cp8-r32   --circuit examples/cp.pc    -D n=8  -D r=32"
)
LORA_STRUCTURE=${LORA_STRUCTURE:-"btree8-r8 --circuit examples/btree.pc -D n=8 -D r=8"}

train_all() {
    run mkdir -p "$HEADS"
    for entry in "${HEAD_PLAN[@]}"; do
        # shellcheck disable=SC2086
        train_head $entry
    done
    local base=${LORA_STRUCTURE%% *} args=${LORA_STRUCTURE#* }
    # shellcheck disable=SC2086
    train_head "$base-lora1" $args --lora-layers 1
    # The time budget becomes a step count after 2 steps, which under other load gave LoRA-2 half of
    # LoRA-1's steps; LoRA-2 gets LoRA-1's step count instead (357 in the recorded study).
    # shellcheck disable=SC2086
    train_head "$base-lora2" $args --lora-layers 2 --steps "${LORA2_STEPS:-357}"
}

distill_data() {  # the LM's continuations of 1024 training prompts (resumes an interrupted file)
    run python -m mtpc.cli distill-data --model "$MODEL" --out runs/lm-samples.jsonl --num-prompts 1024 \
        --prompt-len 64 --max-new-tokens 448 --greedy-fraction 0.5 --no-progress
}

train_distilled() {  # heads trained on the LM's own continuations (self-distillation)
    run mkdir -p "$HEADS"
    distill_data
    train_head ff8-sd --circuit examples/ff.pc -D n=8 --data runs/lm-samples.jsonl
    train_head btree8-r8-sd --circuit examples/btree.pc -D n=8 -D r=8 --data runs/lm-samples.jsonl
}

existing() {  # the trained head folders among the arguments
    for name in "$@"; do
        if (( DRY_RUN )) || [[ -f $HEADS/$name/train_config.json ]]; then echo "$HEADS/$name"; fi
    done
}

bench_run() {  # report name, then mtpc bench arguments (heads, mode, options)
    local name=$1
    shift
    local command=(python -m mtpc.cli bench --model "$MODEL" "${PROMPTS[@]}" --threads "$THREADS" --no-progress
                   --out "$BENCH/$name" "$@")
    if (( DRY_RUN )); then
        run "${command[@]}"
        return
    fi
    echo "== bench $name $(date +%T)"
    "${command[@]}" | tee "$BENCH/$name.txt" \
        || echo "!! mtpc bench exited with $? (1 means a greedy output differed from plain greedy: see bench.json)"
}

bench_all() {
    run mkdir -p "$BENCH"
    local all n8
    mapfile -t all < <(existing ff8 cp8-r1 cp8-r8 cp8-r32 hmm8-r8 btree8-r8 btree8-r8-lora1 btree8-r8-lora2 \
                                ff16 cp16-r8 hmm16-r8 btree16-r8)
    mapfile -t n8 < <(existing ff8 cp8-r8 hmm8-r8 btree8-r8)
    bench_run greedy --heads "${all[@]}" --mode greedy --bonus both
    bench_run sample --heads "${all[@]}" --mode sample --bonus both
    bench_run drafts --heads "${n8[@]}" --mode greedy --draft conditional marginal map
    bench_run greedy-bf16 --heads "${n8[@]}" --mode greedy --bonus both --head-dtype bf16
    bench_extra
}

bench_extra() {  # added after the first pass: greedy before the LM's output degenerates; bf16 in sampling
    run mkdir -p "$BENCH"
    local all n8
    mapfile -t all < <(existing ff8 cp8-r1 cp8-r8 cp8-r32 hmm8-r8 btree8-r8 btree8-r8-lora1 btree8-r8-lora2 \
                                ff16 cp16-r8 hmm16-r8 btree16-r8)
    mapfile -t n8 < <(existing ff8 cp8-r8 hmm8-r8 btree8-r8)
    bench_run greedy-64 --heads "${all[@]}" --mode greedy --bonus both --max-new-tokens 64
    bench_run sample-bf16 --heads "${n8[@]}" --mode sample --bonus both --head-dtype bf16
    figure
}

bench_distilled() {  # corpus-trained vs self-distilled heads, greedy (256 and 64 new tokens) and sampling
    local heads
    mapfile -t heads < <(existing ff8 ff8-sd btree8-r8 btree8-r8-sd btree8-r8-lora1 btree8-r8-lora2)
    bench_run distilled-greedy --heads "${heads[@]}" --mode greedy
    bench_run distilled-greedy-64 --heads "${heads[@]}" --mode greedy --max-new-tokens 64
    bench_run distilled-sample --heads "${heads[@]}" --mode sample
}

figure() {
    run python benchmarks/study_figure.py "$BENCH/greedy/bench.json" "$BENCH/sample/bench.json" \
        --out docs/results_tradeoff.png
    if (( DRY_RUN )) || [[ -f $BENCH/distilled-greedy/bench.json && -f $BENCH/distilled-sample/bench.json ]]; then
        run python benchmarks/study_figure.py "$BENCH/distilled-greedy/bench.json" "$BENCH/distilled-sample/bench.json" \
            --out docs/results_tradeoff_distilled.png --title "corpus-trained vs self-distilled heads (-sd)"
    fi
}

train_shared() {  # issue 7's cheap head: per-position unembedding + low-rank per-unit adapters
    run mkdir -p "$HEADS"
    train_head btree8-r8-shared --circuit examples/btree.pc -D n=8 -D r=8 --parameterisation shared
    distill_data
    train_head btree8-r8-sd-shared --circuit examples/btree.pc -D n=8 -D r=8 --parameterisation shared \
        --data runs/lm-samples.jsonl
}

bench_shared() {
    local heads
    mapfile -t heads < <(existing ff8 ff8-sd btree8-r8 btree8-r8-shared btree8-r8-sd btree8-r8-sd-shared)
    bench_run shared-greedy --heads "${heads[@]}" --mode greedy --bonus both
    bench_run shared-sample --heads "${heads[@]}" --mode sample --bonus both
}

case $STAGE in
    train) train_all ;;
    bench) bench_all ;;
    extra) bench_extra ;;
    distilled) train_distilled && bench_distilled && figure ;;
    shared) train_shared && bench_shared ;;
    figure) figure ;;
    all) train_all && bench_all && train_distilled && bench_distilled && figure && train_shared && bench_shared ;;
    *) echo "usage: $0 [train|bench|extra|distilled|shared|figure|all]" >&2; exit 2 ;;
esac
