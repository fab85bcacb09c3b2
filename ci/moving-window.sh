#!/usr/bin/env bash
# Seeds that move: besides the fixed 0..2000 of `cargo test`, each commit sweeps a window
# of its own, chosen from its hash, so the suite stops measuring only the seeds it has
# been fixed against. Each seed draws its Service (headless, or ClusterIP with each way of
# treating a SYN with no endpoint) as in `cargo test`. Prints the window first and, for any
# failing seed, the command that replays it (naming the Service it drew).
# Usage: ci/moving-window.sh SPUR_SIM [COUNT] [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
sim="$1"
count="${2:-500}"
jobs="${3:-1}"
if commit="$(git rev-parse HEAD 2>/dev/null)"; then
  # 2000 .. 5,000,000, in steps of the window size: past the fixed seeds, far apart.
  start=$(( 2000 + (16#${commit:0:8} % 9996) * count ))
else
  commit="(no git)"
  start=2000
fi
echo "moving seed window for commit $commit: --seeds $start..$((start + count))"
echo "(any window runs by hand: spur-sim run --seeds A..B; a failure prints its replay command)"
exec "$sim" run --seeds "$start..$((start + count))" --jobs "$jobs"
