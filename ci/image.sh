#!/usr/bin/env bash
# Builds the operator's production image offline and runs the operator from it, as ci/test.sh
# does on every change:
#
#   bash ci/image.sh            # the image, its checks, its SBOM, and the smoke runs
#
# 1. the release binary (cargo build --release --locked, without .cargo/config.toml's
#    `--cfg tokio_unstable`), its root filesystem assembled by
#    deploy/image/rootfs.sh, and the Dockerfile's `runtime` stage built by buildah from it (the
#    `build` stage, which needs a registry, is replaced by that directory: --build-context);
# 2. the OCI archive checked (user 65532, entrypoint, version and source labels, no shell)
#    and unpacked, its file list with hashes written beside it, and an SPDX SBOM;
# 3. from the unpacked root, read-only and as uid 65532 (ci/image-run.sh), inside a private
#    network namespace: `--help`, `--version` (no tokio_unstable), `check-controller` against the real spurctld
#    (also through a name /etc/hosts gives two addresses, the first refusing), and `run`
#    until /readyz answers 200 against it and `spur-sim kube-api`.
#
# Outputs in $IMAGE_OUT (default target/image): spur-operator.oci.tar, files.txt,
# spur-operator.spdx.json, and rootfs/ (the lab runs its operators from it). Needs root
# (mounts, namespaces, buildah's storage) and the real spurctld ($SPURCTLD).
set -euo pipefail
cd "$(dirname "$0")/.."

out="${IMAGE_OUT:-target/image}"
spurctld="${SPURCTLD:-../shared/peers/spurctld/spurctld}"
# Bounds of the smoke runs: a replica listens within a second or two, and the operator is
# ready within its first heartbeat round; these leave a loaded CI machine ten times that.
listen_bound=30
ready_bound=60

if [ "${1:-}" = "--smoke" ]; then
  # Re-entered by the last step, inside `unshare --net`: a loopback of its own, so these
  # processes neither see nor disturb anything else on the machine.
  rootfs="$(realpath "$2")"
  ip link set lo up
  dir="$(mktemp -d /tmp/spur-image-smoke.XXXXXX)"
  chmod 0755 "$dir" # the operator runs as 65532 and reads the kubeconfig
  pids=()
  finish() {
    status=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    # Anything else still running on this run's files (none, unless a kill missed).
    pkill -KILL -f "$dir" 2>/dev/null || true
    if [ "$status" -ne 0 ]; then
      for log in "$dir"/*.log; do
        echo "--- $log (last lines)" >&2
        tail -n 30 "$log" >&2 || true
      done
    fi
    rm -rf "$dir"
  }
  trap finish EXIT
  # exec, so that a background run's $! is the operator itself (unshare, sh and chroot each
  # exec the next), which the trap can kill.
  operator() {
    exec unshare --mount --propagation private -- \
      sh ci/image-run.sh "$rootfs" 65532 "$dir" -- /usr/local/bin/spur-operator "$@"
  }
  wait_for() { # SECONDS DESCRIPTION COMMAND...: polls COMMAND until it succeeds
    local bound=$1 what=$2
    shift 2
    for _ in $(seq $((bound * 10))); do
      if "$@" >/dev/null 2>&1; then return 0; fi
      sleep 0.1
    done
    echo "image: $what did not happen within ${bound}s" >&2
    return 1
  }

  echo "image: --help from the image's root"
  help_text="$(operator --help)"
  grep -q '^Usage: spur-operator' <<<"$help_text"
  echo "image: upstream's command name, spur-k8s-operator, runs the operator"
  upstream_help="$(exec unshare --mount --propagation private -- \
    sh ci/image-run.sh "$rootfs" 65532 "$dir" -- /usr/local/bin/spur-k8s-operator --help)"
  grep -q '^Usage: spur-k8s-operator' <<<"$upstream_help"
  echo "image: --version names a release build (no --cfg tokio_unstable)"
  version_text="$(operator --version)"
  if grep -q tokio_unstable <<<"$version_text"; then
    echo "image: the operator was built with --cfg tokio_unstable: $version_text" >&2
    exit 1
  fi

  "$spurctld" -D --state-dir "$dir/spurctld-state" --listen 127.0.0.1:6817 -f /nonexistent \
    >"$dir/spurctld.log" 2>&1 &
  pids+=($!)
  wait_for "$listen_bound" "spurctld listening on 127.0.0.1:6817" bash -c ': </dev/tcp/127.0.0.1/6817'
  echo "image: check-controller against the real spurctld"
  (operator check-controller --controller-addr http://127.0.0.1:6817)
  # A name /etc/hosts lists twice, first at an address nothing listens on: a dial moves on
  # from a refusal only if the name resolved to both (the image's /etc/host.conf; without
  # it glibc gives the first line alone and this fails, refused).
  printf '127.0.0.1 localhost\n127.0.0.2 spurctld.smoke\n127.0.0.1 spurctld.smoke\n' >"$dir/hosts"
  echo "image: check-controller through a name /etc/hosts gives two addresses, the first refusing"
  (export IMAGE_RUN_HOSTS="$dir/hosts" && operator check-controller --controller-addr http://spurctld.smoke:6817)

  target/debug/spur-sim kube-api --listen 127.0.0.1:8001 --kubeconfig "$dir/kubeconfig" \
    --seed-nodes 2 >"$dir/kube-api.log" 2>&1 &
  pids+=($!)
  wait_for "$listen_bound" "spur-sim kube-api writing its kubeconfig" test -s "$dir/kubeconfig"
  chmod 0644 "$dir/kubeconfig"
  # The namespace of the operator's Lease, as deploy/ creates it.
  # (JSON on stdin: `kubectl create namespace` sends protobuf, which spur-sim does not read.)
  echo '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "spur-system"}}' |
    kubectl --kubeconfig "$dir/kubeconfig" create -f - >/dev/null
  echo "image: run, until /readyz answers"
  (operator run --kubeconfig "$dir/kubeconfig" --controller-addr http://127.0.0.1:6817 \
    --agent-listen 127.0.0.1:6818 --agent-address 127.0.0.1 --health-listen 127.0.0.1:8080 \
    --identity image-smoke --namespace spur-system >"$dir/operator.log" 2>&1) &
  pids+=($!)
  wait_for "$ready_bound" "the operator's /readyz answering 200" \
    curl --silent --fail --max-time 2 http://127.0.0.1:8080/readyz
  # It runs as the image's user, and its root is read-only.
  operator_pid="${pids[-1]}"
  uid="$(awk '/^Uid:/ { print $2 }' "/proc/$operator_pid/status")"
  if [ "$uid" != 65532 ]; then
    echo "image: the operator runs as uid $uid, not 65532" >&2
    exit 1
  fi
  if ! grep -q ' / [^ ]* ro[, ]' "/proc/$operator_pid/mounts"; then
    echo "image: the operator's root is not read-only:" >&2
    grep ' / ' "/proc/$operator_pid/mounts" >&2
    exit 1
  fi
  # It leads (the Lease) and registered spur-sim's two seeded nodes with the real spurctld.
  registered() {
    curl --silent --fail --max-time 2 http://127.0.0.1:8080/metrics |
      grep -qx 'spur_operator_nodes_registered 2'
  }
  wait_for "$ready_bound" "the two seeded nodes registered (spur_operator_nodes_registered 2)" registered
  echo "image: ready and registering, as uid 65532 on a read-only root"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "image: needs root (buildah's storage, mounts and namespaces)" >&2
  exit 1
fi
if [ ! -x "$spurctld" ]; then
  echo "image: the real spurctld is missing ($spurctld); set SPURCTLD" >&2
  exit 1
fi

version="$(cargo pkgid -p spur-operator | sed 's/.*[#@]//')"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  revision="$revision-dirty"
fi
# Every timestamp in the image (config and file times) is the commit's: the same commit
# gives the same archive.
epoch="$(git log -1 --format=%ct 2>/dev/null || echo 0)"

echo "image: release build"
# RUSTFLAGS set (empty) replaces .cargo/config.toml's `--cfg tokio_unstable`, which only the
# simulation needs; ci/test.sh's background release build uses the same, so nothing is
# rebuilt here.
RUSTFLAGS='' cargo build --release --locked -p spur-operator --bin spur-operator
# target/debug/spur-sim as the tests build it: `cargo build` of it (alone, or without the
# tests' dev-dependencies) would resolve its dependencies' features apart and build them
# all again.
cargo test --workspace --locked --no-run

rm -rf "$out"
mkdir -p "$out/empty"
sh deploy/image/rootfs.sh target/release/spur-operator "$out/context/rootfs" "$out/sources.tsv"

# buildah's storage is the run's own, removed at the end: nothing is left in the machine's.
bh() { buildah --root "$out/storage" --runroot "$out/runroot" --storage-driver vfs "$@"; }
cleanup_storage() {
  bh rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$out/storage" "$out/runroot" "$out/context" "$out/empty"
}
trap cleanup_storage EXIT
tag="localhost/spur-operator:$version"
echo "image: buildah build of $tag ($revision)"
bh build --quiet --pull=never --build-context build="$out/context" --target runtime \
  --timestamp "$epoch" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  -f Dockerfile -t "$tag" "$out/empty" >/dev/null
bh push --quiet "$tag" "oci-archive:$out/spur-operator.oci.tar:spur-operator:$version"
cleanup_storage
trap - EXIT

python3 ci/image_inspect.py "$out/spur-operator.oci.tar" --version "$version" \
  --revision "$revision" --unpack "$out/rootfs" --files "$out/files.txt"
python3 ci/sbom.py --sources "$out/sources.tsv" --version "$version" --revision "$revision" \
  --epoch "$epoch" >"$out/spur-operator.spdx.json"
echo "image: $(du -b "$out/spur-operator.oci.tar" | cut -f1) bytes, $(wc -l <"$out/files.txt") files; SBOM $out/spur-operator.spdx.json"

timeout --kill-after=10s 180s unshare --net -- bash "$0" --smoke "$out/rootfs"
