#!/bin/sh
# Assembles the root filesystem of an image that runs one release binary: the binary, exactly
# the shared libraries the loader resolves for it, the CA bundle rustls-native-certs reads,
# and the nonroot user (uid 65532, as distroless's). No shell and no package manager.
#
#   sh deploy/image/rootfs.sh BINARY OUT_DIR [SOURCES_TSV]
#
# The Dockerfile's build stage runs it, and so does ci/image.sh on a Debian bookworm host
# (the build stage's release), so the image is the same file list however it is built.
# SOURCES_TSV, when given, gets one line per file taken from the host: its path in the image
# and the host path it came from (ci/sbom.py names the Debian package of each).
set -eu

bin=$1
out=$2
sources=${3:-/dev/null}

if [ -e "$out" ]; then
  echo "rootfs: $out exists; give a fresh directory" >&2
  exit 1
fi
: >"$sources"

# take SOURCE DEST MODE: copies a host file (following links) to DEST in the image.
take() {
  install -D -m "$3" "$1" "$out$2"
  printf '%s\t%s\n' "$2" "$(readlink -f "$1")" >>"$sources"
}

image_bin="/usr/local/bin/$(basename "$bin")"
take "$bin" "$image_bin" 0755
# Without its DWARF (the line tables of the release profile: 106 MB of the operator's 133),
# keeping the symbol table, so a panic's backtrace still names functions; the build's own
# binary keeps the line tables for symbolizing an address.
objcopy --strip-debug "$out$image_bin"
# Upstream's Deployment runs `command: [spur-k8s-operator]`: under that name too, so a user
# of upstream's manifests changes the image and nothing else.
if [ "$(basename "$bin")" = spur-operator ]; then
  ln -s spur-operator "$out/usr/local/bin/spur-k8s-operator"
fi

# The loader lists what it maps: "name => /path (addr)" for each library and "/path (addr)"
# for itself; the vDSO has no file. Asking the loader (not ldd, which slim images lack)
# gives exactly the paths the binary will open at run time.
loader=
for candidate in /lib64/ld-linux-x86-64.so.2 /lib/ld-linux-aarch64.so.1; do
  if [ -x "$candidate" ]; then
    loader=$candidate
    break
  fi
done
if [ -z "$loader" ]; then
  echo "rootfs: no dynamic loader found" >&2
  exit 1
fi
"$loader" --list "$bin" | while read -r first second third _; do
  case "$first" in
  /*) take "$first" "$first" 0755 ;;
  *)
    if [ "$second" = "=>" ] && [ "${third#/}" != "$third" ]; then
      take "$third" "$third" 0755
    fi
    ;;
  esac
done

# TLS to spurctld (--controller-tls-ca aside) and to the API server trusts the system roots.
take /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt 0644

mkdir -p "$out/etc" "$out/home/nonroot" "$out/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$out/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$out/etc/group"
# Names resolve from /etc/hosts first, then DNS (a headless Service's name gives every ready
# pod): without nsswitch.conf glibc asks DNS first. /etc/hosts is empty, the file the
# runtime mounts its own over (the kubelet writes the pod's).
printf 'hosts: files dns\n' >"$out/etc/nsswitch.conf"
: >"$out/etc/hosts"
# A name /etc/hosts lists on several lines (a pod's hostAliases giving one name every
# spurctld replica; the lab's headless Service) resolves to all of them, as DNS answers
# with every ready pod: without this file glibc's getaddrinfo answers the first line only,
# and every dial reached one replica (the lab's headless leader-freeze waited 14.75 s on it
# frozen). Debian's base-files ships the same line.
printf 'multi on\n' >"$out/etc/host.conf"
chmod 0644 "$out/etc/passwd" "$out/etc/group" "$out/etc/nsswitch.conf" "$out/etc/hosts" \
  "$out/etc/host.conf"
chmod 0700 "$out/home/nonroot"
chown 65532:65532 "$out/home/nonroot"
chmod 1777 "$out/tmp"
