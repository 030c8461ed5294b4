# cuda/bench/run_context.sh — sourced by the single-run result scripts (fwd_window.sh, bwd_window.sh,
# bwd_gqa.sh, varlen.sh): where the binaries and the outputs are, and what every row of a run
# starts with, set once per run.
#
#   . "$(dirname "$0")/run_context.sh" "${1:-gpu-carry}" "${2:-/tmp/flashlab-NAME}"
#
# Sets bin (the binaries, with `commit` beside them: git describe of the tree that built them),
# out (made if missing), here (cuda/bench), commit, date (UTC, YYYY-MM-DD HH:MM), device (the GPU's
# name) and status=0 (a script sets it to 1 when a step fails and exits with it).
bin=$1
out=$2
here=$(dirname "${BASH_SOURCE[0]}")
mkdir -p "$out"
commit=$(cat "$bin/commit" 2>/dev/null || echo unknown)
date=$(date -u '+%Y-%m-%d %H:%M')
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
status=0
