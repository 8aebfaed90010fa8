#!/bin/sh
# A /dev/shm too small for the data segment (1 MiB, in a mount namespace of its own): the
# set declines shm at creation (posix_fallocate), says why at debug level, and the job's
# collectives run over the transport and pass. Needs root (mount); skipped (77) otherwise.
# Usage: small_devshm_test.sh TUTTIRUN INTEG_BINARY
set -u
[ "$(id -u)" = 0 ] && command -v unshare >/dev/null || { echo "skipped: needs root and unshare"; exit 77; }
out=$(timeout 120 unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm || exit 77
  TUTTI_LOG_LEVEL=debug TUTTI_TIMEOUT_SECONDS=60 "$0" -np 2 --gloo "$1" 2>&1' "$1" "$2")
rc=$?
echo "$out" | tail -20
[ $rc = 77 ] && { echo "skipped: cannot mount a tmpfs"; exit 77; }
[ $rc = 0 ] || { echo "FAILED: the job exited $rc"; exit 1; }
echo "$out" | grep -q "does not use shm: posix_fallocate" || { echo "FAILED: no decline message"; exit 1; }
echo "ok"
