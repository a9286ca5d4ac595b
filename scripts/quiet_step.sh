# Sourced by the set-up scripts: `step CMD...` runs CMD quietly and, when it fails, prints its own output and
# "set-up of $SETUP_NAME failed: CMD" and exits. The log is one temporary file, removed on exit.
step_log=$(mktemp)
trap 'rm -f "$step_log"' EXIT
step() {
    if ! "$@" >"$step_log" 2>&1; then
        cat "$step_log" >&2
        echo "set-up of $SETUP_NAME failed: $*" >&2
        exit 1
    fi
}
