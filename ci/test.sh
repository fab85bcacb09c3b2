#!/usr/bin/env bash
# Every check the project has, as CI runs it (.ci/run calls exactly this). Run it from
# anywhere; it installs what a fresh machine lacks through ci/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

bash ci/install-deps.sh
. ci/tools.sh

# Two cores: keep parallelism explicit so the build does not thrash memory or the other
# jobs sharing the machine.
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A build from a clean checkout gains nothing from incremental compilation's records, and
# writing them costs time and disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Each step names the seconds since the start, so a slow one shows in CI's log.
step() { printf '\n== %s (at %d s)\n' "$*" "$SECONDS"; }

step "format"
cargo fmt --all -- --check

step "Dockerfile"
hadolint Dockerfile

step "manifests"
# Renders offline; the tests then apply it against the simulated API server.
kubectl kustomize deploy/ >/dev/null
kubectl kustomize deploy/sim-sweep/ >/dev/null
# Each component on deploy/, as a user's kustomization lists both (kustomize refuses an
# overlay inside deploy/ itself), and all of them together, as they must compose.
render_with_components() {
  local kustomization listed=() component
  kustomization="$(mktemp -d)"
  for component in "$@"; do
    listed+=("$(realpath --relative-to="$kustomization" "$component")")
  done
  local IFS=,
  printf '%s\n' "resources: [$(realpath --relative-to="$kustomization" deploy)]" \
    "components: [${listed[*]}]" >"$kustomization/kustomization.yaml"
  kubectl kustomize "$kustomization" >/dev/null
  rm -r "$kustomization"
}
for component in deploy/components/*/; do
  render_with_components "$component"
done
render_with_components deploy/components/*/

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "real peer"
# The conformance suite and the end-to-end cases run against the real spurctld
# (crates/spur-lab/src/real_peer.rs finds it the same way). Without it those cases fail, naming it (a
# case that cannot run is never reported as passed), so the run stops here instead.
spurctld="${SPURCTLD:-../shared/peers/spurctld/spurctld}"
if [ -x "$spurctld" ]; then
  echo "real spurctld: $spurctld"
else
  echo "The REAL spurctld was not found ($spurctld): the conformance and end-to-end cases need it." >&2
  echo "Build ROCm/spur's spurctld (cargo build --release -p spurctld) and set SPURCTLD=/path/to/spurctld." >&2
  exit 1
fi
# Real processes the tests start are stopped by the tests, even when one panics; this
# catches what a killed test run leaves (their command lines name the tests' temp dirs),
# and the background jobs started below.
background=()
cleanup() {
  for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
  pkill -f "/spur-real-" 2>/dev/null || true
  pkill -f "spur-sim lab" 2>/dev/null || true
  pkill -f "/spur-image-smoke" 2>/dev/null || true
}
trap cleanup EXIT

step "tests"
# The image's release build, beside the tests at the lowest priority: the real-time suites
# (the real peer, end to end, the processes) leave the CPU idle much of the time. A build of
# its own profile (target/release), so it does not wait on the tests' build lock.
release_log="$(mktemp)"
# Without .cargo/config.toml's `--cfg tokio_unstable` (RUSTFLAGS set replaces it), as
# ci/image.sh builds it: only the simulation needs the flag.
RUSTFLAGS='' nice -n 19 cargo build --release --locked -p spur-operator --bin spur-operator >"$release_log" 2>&1 &
release_pid=$!
background+=("$release_pid")
# Every debug build here is `cargo test --workspace`: a run of one package (`-p`, or
# `--exclude`) or a `cargo build` (no dev-dependencies) would resolve the dependencies'
# features apart from it and build them all again. The test build makes the binaries too
# (target/debug/spur-operator, which the end-to-end cases run, and target/debug/spur-sim).
cargo test --workspace --locked --no-run
# Every target but the sweeps (run after the image, below), the test targets by the
# manifests' own list, so a new one is not left out. A hard bound on the whole run: the
# real-time suites bound each case themselves (150 s a conformance case, 150 s an
# end-to-end case); this catches anything else that hangs.
mapfile -t other_tests < <(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        if "test" in target["kind"] and target["name"] != "sweeps":
            print("--test")
            print(target["name"])
')
timeout --kill-after=30s 2400s cargo test --workspace --locked --lib --bins "${other_tests[@]}"
timeout --kill-after=30s 600s cargo test --workspace --locked --doc

step "image"
# The production image, built offline with buildah from that release binary, checked, and
# run: --help, check-controller and run until /readyz, from its read-only root as uid
# 65532 against the real spurctld (ci/image.sh). Needs root, as the lab does.
release_status=0
wait "$release_pid" || release_status=$?
if [ "$release_status" -ne 0 ]; then
  cat "$release_log" >&2
  echo "the release build failed (status $release_status)" >&2
  exit "$release_status"
fi
rm -f "$release_log"
operator_root=()
if [ "$(id -u)" -eq 0 ] && [ -x "$spurctld" ]; then
  timeout --kill-after=30s 900s bash ci/image.sh
  operator_root=(--operator-root target/image/rootfs)
elif [ "${CI:-}" = "true" ]; then
  echo "CI: the image needs root (buildah, mounts) and the real spurctld" >&2
  exit 1
else
  echo "!!! The image was NOT built (it needs root and the real spurctld): bash ci/image.sh"
fi

# The seed sweeps (thousands of simulated scenarios: CPU only, nothing real-time) at the
# lowest priority, beside the pictures, the lab and the moving window, whose idle CPU they
# take; their result is awaited at the end. Not beside the real-time suites above, whose
# tightest bound is 3 s (a SpurJob's id after a leader change): a run of them with the
# sweeps beside went over it once (docs/evidence.md). The simulation's time is its
# own, so running slower changes none of its figures.
sweeps_log="$(mktemp)"
nice -n 19 timeout --kill-after=30s 3000s cargo test --workspace --locked --test sweeps >"$sweeps_log" 2>&1 &
sweeps_pid=$!
background+=("$sweeps_pid")

step "pictures"
# The pictures a person reads a run from (ci/pictures.sh): a failing seed-fix scenario's
# HTML timeline rendered in headless Chromium and its DOM checked, the compare plot parsed:
# a few seconds.
cargo test --workspace --locked --no-run
timeout --kill-after=30s 300s bash ci/pictures.sh target/debug/spur-sim target/pictures

step "lab, beside the moving seed window"
# The named scenarios (crates/spur-judge/src/catalogue.rs) on real processes: real spurctld
# replicas and the real operator binary, each scenario in a private network namespace of
# its own, faults made by nftables and signals, four at a time; each beside its simulated
# twin (the fidelity table). The operators run from the image just built, as it ships. Each scenario is killed past its plan's end plus 60 s; the
# whole step is bounded too. Its namespace goes with its process. Needs root: CI's machine
# runs as root; elsewhere it is said loudly. The long `unbounded` runs are by hand (docs/lab.md).
# With each run's HTML timeline and the lags' plot (target/pictures/).
# Beside the lab, at the lowest CPU priority (the lab's real processes keep the CPU they
# need; the sweep takes what they leave): 500 seeds from a window this commit's hash
# chooses (ci/moving-window.sh), past the fixed 0..2000 of the tests.
window_log="$(mktemp)"
nice -n 19 timeout --kill-after=30s 1800s bash ci/moving-window.sh target/debug/spur-sim 500 2 >"$window_log" 2>&1 &
window_pid=$!
background+=("$window_pid")
if [ "$(id -u)" -eq 0 ] && [ -x "$spurctld" ]; then
  timeout --kill-after=30s 900s target/debug/spur-sim lab --compare-sim --jobs 4 "${operator_root[@]}" \
    --plot target/pictures/lab.svg --html target/pictures/lab
  # The lab's lags beside its twins': one curve each in every panel.
  python3 ci/pictures_check.py --plot target/pictures/lab.svg lab,simulation
  # The Service as upstream deploys it (headless: the name resolves to the ready pods and
  # the operator picks among them), in the scenarios that change which pods are ready or
  # reachable: one round of four.
  timeout --kill-after=30s 300s target/debug/spur-sim lab --service headless --compare-sim --jobs 4 \
    "${operator_root[@]}" --scenario late-controller --scenario leader-kill-silent \
    --scenario leader-freeze --scenario follower-kill
  # The lab without the real binary (`--replicas simulated`: the model's replicas as one
  # process each on the same addresses, under the same kernel faults and signals), so the
  # lab runs where spurctld is absent: one round of four, the faults that need the
  # replicas' own processes (black hole and kill, SIGSTOP, a cut between replicas, a
  # replacement pod).
  timeout --kill-after=30s 300s target/debug/spur-sim lab --replicas simulated --jobs 4 \
    "${operator_root[@]}" --scenario leader-kill-silent --scenario leader-freeze \
    --scenario leader-cut-off --scenario follower-kill
  # The model of a healed cut against the kernel's retransmission (docs/lab.md).
  timeout --kill-after=10s 120s target/debug/spur-sim lab-heal
elif [ "${CI:-}" = "true" ]; then
  echo "CI: the lab needs root and the real spurctld" >&2
  exit 1
else
  echo "!!! The lab did NOT run (it needs root and the real spurctld): spur-sim lab --compare-sim"
fi

# Waits for a background job, prints its log, and stops the run if it failed, saying what.
await_background() {
  local what="$1" pid="$2" log="$3" status=0
  wait "$pid" || status=$?
  cat "$log"
  rm -f "$log"
  if [ "$status" -ne 0 ]; then
    echo "$what failed (status $status): replay each failing seed with the command printed above" >&2
    exit "$status"
  fi
}

step "moving seed window"
await_background "the moving seed window" "$window_pid" "$window_log"

step "seed sweeps"
await_background "the seed sweeps" "$sweeps_pid" "$sweeps_log"
