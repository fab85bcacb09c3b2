#!/usr/bin/env bash
# The pictures a person reads a run from, checked in a real browser: the HTML timeline of
# a named scenario that misses its deadline under the seed's fix (leader-kill-silent,
# seed-fix: a call hangs on the leader whose pod died silently for the profile's 30 s
# bound and a SpurJob waits past the submission deadline) is opened in headless Chromium, screenshotted, and
# its rendered DOM must hold the lanes, the fault's shade and a red missed deadline; the
# compare plot must parse as SVG with one curve per profile in every panel.
# Usage: ci/pictures.sh SPUR_SIM OUT_DIR
set -euo pipefail
sim="$1"
out="$2"
mkdir -p "$out"
chromium_bin="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$chromium_bin" ]; then
  echo "pictures: chromium is missing (ci/install-deps.sh installs Debian's chromium)" >&2
  exit 1
fi

# The scenario fails its submission deadline: that is the picture's point, so exit 1 is
# expected here and the page must exist.
status=0
"$sim" lab --scenario leader-kill-silent --profile seed-fix --sim-only --sim-seeds 1 \
  --html "$out" --plot "$out/lab-sim.svg" >"$out/lab-sim.txt" 2>&1 || status=$?
if [ "$status" -ne 1 ]; then
  cat "$out/lab-sim.txt" >&2
  echo "pictures: leader-kill-silent under seed-fix was expected to fail its checks (exit 1), got $status" >&2
  exit 1
fi
page="$out/leader-kill-silent-seed-fix-sim-1.html"
[ -s "$page" ] || { echo "pictures: $page was not written" >&2; exit 1; }

# Chromium's profile and crash dumps go to a directory of this run, removed after.
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
browse() {
  timeout 120s "$chromium_bin" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$profile" --window-size=1600,760 "$@" 2>/dev/null
}
browse --screenshot="$out/leader-kill-silent-seed-fix.png" "file://$(realpath "$page")" >/dev/null
browse --virtual-time-budget=5000 --dump-dom "file://$(realpath "$page")" >"$out/leader-kill-silent-seed-fix.dom.html"

"$sim" compare --seeds 0..20 --plot "$out/compare.svg" >"$out/compare.txt"
python3 "$(dirname "$0")/pictures_check.py" \
  --dom "$out/leader-kill-silent-seed-fix.dom.html" \
  --screenshot "$out/leader-kill-silent-seed-fix.png" \
  --plot "$out/compare.svg" default,unbounded,seed-fix \
  --plot "$out/lab-sim.svg" simulation
