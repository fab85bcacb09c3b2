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

step() { printf '\n== %s\n' "$*"; }

step "format"
cargo fmt --all -- --check

step "Dockerfile"
hadolint Dockerfile

step "manifests"
# Renders offline; the tests then apply it against the simulated API server.
kubectl kustomize deploy/ >/dev/null
kubectl kustomize deploy/sim-sweep/ >/dev/null

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
cargo test --workspace --locked
