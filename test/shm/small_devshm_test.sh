#!/bin/sh
# A /dev/shm too small for the data segment (1 MiB, in a mount namespace of its own):
#  - with TUTTI_SHM_BUFFER_BYTES=auto (the default) the set's root halves the buffer until
#    the segment fits, says so at debug level, and the job runs over shm;
#  - with an explicit 1 MiB buffer the set declines shm at creation (posix_fallocate), says
#    why at debug level, and the job's collectives run over the transport.
# Both jobs must pass. Needs root (mount); skipped (77) otherwise.
# Usage: small_devshm_test.sh TUTTIRUN INTEG_BINARY
set -u
[ "$(id -u)" = 0 ] && command -v unshare >/dev/null || { echo "skipped: needs root and unshare"; exit 77; }
run() {  # $1: TUTTI_SHM_BUFFER_BYTES
  timeout 120 unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm || exit 77
    TUTTI_SHM_BUFFER_BYTES=$2 TUTTI_LOG_LEVEL=debug TUTTI_TIMEOUT_SECONDS=60 "$0" -np 2 --gloo "$1" 2>&1' \
    "$TUTTIRUN" "$INTEG" "$1"
}
TUTTIRUN=$1 INTEG=$2
out=$(run auto); rc=$?
echo "$out" | tail -5
[ $rc = 77 ] && { echo "skipped: cannot mount a tmpfs"; exit 77; }
[ $rc = 0 ] || { echo "FAILED: the job (auto buffer) exited $rc"; exit 1; }
echo "$out" | grep -q "no room in /dev/shm for .* trying half" || { echo "FAILED: auto did not halve"; exit 1; }
echo "$out" | grep -q "does not use shm" && { echo "FAILED: auto declined shm"; exit 1; }
out=$(run 1048576); rc=$?
echo "$out" | tail -5
[ $rc = 0 ] || { echo "FAILED: the job (1 MiB buffer) exited $rc"; exit 1; }
echo "$out" | grep -q "does not use shm: posix_fallocate" || { echo "FAILED: no decline message"; exit 1; }
echo "ok"
