#!/bin/sh
# Runs a program from an image's root filesystem the way a container runtime would, without
# one (none runs here): the root read-only, a fresh tmpfs on /tmp, as a non-root uid, and of
# the host only what is bound in. Call it in a mount namespace of its own, as root:
#
#   unshare --mount --propagation private -- sh ci/image-run.sh ROOT UID BIND -- PROGRAM ARGS...
#
# BIND (a host directory under /tmp, or "" for none) appears at the same path inside: the
# files a run is given, as a Kubernetes volume would give them (a kubeconfig). With
# IMAGE_RUN_HOSTS set to a file, that file is the image's /etc/hosts, as the kubelet mounts
# the pod's (hostAliases included). ci/image.sh
# runs the image's smoke tests with it. The lab (spur-sim lab --operator-root) does the same
# mounts in Rust (crates/spur-lab/src/kernel.rs, ImageRoot): it must enter the root before each
# pod's change of user and set the pod's death signal after it, which `chroot --userspec`
# here would clear.
set -eu
root=$1
uid=$2
bind=$3
shift 3
if [ "${1:-}" = "--" ]; then
  shift
fi
# A mount of its own first, so that read-only applies here and not to the host's copy.
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t tmpfs -o mode=1777,size=64m tmpfs "$root/tmp"
if [ -n "$bind" ]; then
  case "$bind" in
  /tmp/?*) ;;
  *)
    echo "image-run: $bind must be a directory under /tmp (the image's /tmp is a tmpfs here)" >&2
    exit 1
    ;;
  esac
  mkdir -p "$root$bind"
  mount --bind "$bind" "$root$bind"
fi
if [ -n "${IMAGE_RUN_HOSTS:-}" ]; then
  mount --bind "$IMAGE_RUN_HOSTS" "$root/etc/hosts"
fi
exec chroot --userspec="$uid:$uid" "$root" "$@"
