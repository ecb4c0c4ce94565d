# The start every recipe (study.sh, subword.sh) shares, sourced after it cd's to the repository root with
# its own arguments in place: `--help` prints the recipe's header comment (from line 2 to `set -euo`) and
# exits; `--dry-run`, before or after the stage, sets DRY_RUN=1 and is taken out of the arguments; any
# other option is refused (a mistyped `--dry-run` must not start hours of training). `run CMD...` then
# runs a command, or with DRY_RUN=1 prints it shell-quoted on one line (what --dry-run shows and the
# tests parse).
DRY_RUN=0
RECIPE_ARGS=()
for arg in "$@"; do
    case $arg in
        -h|--help|help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        --dry-run) DRY_RUN=1 ;;
        -*) echo "$0: error: unknown option $arg (options: --dry-run, --help)" >&2; exit 2 ;;
        *) RECIPE_ARGS+=("$arg") ;;
    esac
done
set -- "${RECIPE_ARGS[@]}"

run() {
    if (( DRY_RUN )); then
        printf '%q ' "$@" | sed 's/ $//'
        echo
    else
        "$@"
    fi
}
