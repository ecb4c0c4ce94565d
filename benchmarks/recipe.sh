# The start every recipe (study.sh, subword.sh) shares, sourced after it cd's to the repository root with
# its own arguments in place: `--help` prints the recipe's header comment (from line 2 to `set -euo`) and
# exits; `--dry-run` sets DRY_RUN=1 and is shifted off. `run CMD...` then runs a command, or with DRY_RUN=1
# prints it shell-quoted on one line (what --dry-run shows and the tests parse).
DRY_RUN=0
case ${1:-} in
    -h|--help|help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    --dry-run) DRY_RUN=1; shift ;;
esac

run() {
    if (( DRY_RUN )); then
        printf '%q ' "$@" | sed 's/ $//'
        echo
    else
        "$@"
    fi
}
