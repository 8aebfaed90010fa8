#!/usr/bin/env bash
# Installs the current Tutti build into a temporary root, builds examples/cpp against it out
# of tree (CMake find_package, and pkg-config), and runs the trainer under mpirun -np 2 and as
# a world of one. Fails on any build error, a trainer linked to the build tree instead of the
# install, a non-zero exit, or replicas that do not hold identical weights.
#
# usage: example_cpp_test.sh <tutti build dir> <tutti source dir> [<mpiexec> [<tuttirun>]]
# mpiexec "" or absent (no MPI backend): the mpirun run is left out; with tuttirun the trainer
# also runs as three ranks over gloo.
set -euo pipefail

build=$1
src=$2
mpiexec=${3:-}
tuttirun=${4:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/tutti-example.XXXXXX")
trap 'rm -rf "$work"' EXIT

step() { echo "== $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. Install. DESTDIR keeps every file (even one with an absolute destination) inside $work.
step "install $build"
root="$work/root"
prefix_in_root=/opt/tutti
prefix="$root$prefix_in_root"
DESTDIR="$root" cmake --install "$build" --prefix "$prefix_in_root" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install"; }
[ -f "$prefix/include/tutti/tutti.h" ] || fail "no include/tutti/tutti.h under $prefix"
[ -f "$prefix/include/tutti/tutti.hpp" ] || fail "no include/tutti/tutti.hpp under $prefix"
config=$(find "$prefix" -name TuttiConfig.cmake | head -n 1)
[ -n "$config" ] || fail "no TuttiConfig.cmake under $prefix"
pc=$(find "$prefix" -name tutti.pc | head -n 1)
[ -n "$pc" ] || fail "no tutti.pc under $prefix"
libdir=$(dirname "$(find "$prefix" -name 'libtutti.so' | head -n 1)")
[ -n "$libdir" ] && [ "$libdir" != . ] || fail "no libtutti.so under $prefix"

# 2. Out-of-tree CMake build: find_package(Tutti) + Tutti::tutti.
step "configure and build examples/cpp with find_package(Tutti)"
cmake -S "$src/examples/cpp" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "configure examples/cpp"; }
cmake --build "$work/build" -j2 > "$work/build.log" 2>&1 ||
  { cat "$work/build.log"; fail "build examples/cpp"; }
trainer="$work/build/trainer"
linked=$(ldd "$trainer" | awk '/libtutti/ {print $3}')
echo "trainer links $linked"
case "$linked" in
  "$libdir"/*) ;;
  *) fail "trainer links '$linked', not the installed library under $libdir" ;;
esac

# 3. The pkg-config way (prefix redefined: the .pc file was configured for the build's prefix).
step "build with pkg-config"
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
pcflags=$(pkg-config --define-variable=prefix="$prefix" --cflags --libs tutti) ||
  fail "pkg-config --cflags --libs tutti"
echo "pkg-config: $pcflags"
# shellcheck disable=SC2086
c++ -std=c++17 -O2 -Wall -Wextra "$src/examples/cpp/trainer.cc" $pcflags \
  -Wl,-rpath,"$libdir" -o "$work/trainer_pc" || fail "c++ with pkg-config flags"

# 4. Run: two ranks under mpirun, then one process without a launcher.
check_run() {  # <log> <expected ranks>
  grep -q "ranks $2 .*weights identical on all ranks: yes" "$1" ||
    { cat "$1"; fail "trainer output lacks 'ranks $2 ... identical ... yes'"; }
}
if [ -n "$mpiexec" ]; then
  step "mpirun -np 2 trainer"
  "$mpiexec" -np 2 --oversubscribe --bind-to none --mca btl self,vader "$trainer" --steps 200 \
    > "$work/run2.log" 2>&1 || { cat "$work/run2.log"; fail "mpirun -np 2 trainer"; }
  cat "$work/run2.log"
  check_run "$work/run2.log" 2
else
  step "no MPI backend in this build: two-rank run left out"
fi

if [ -n "$tuttirun" ]; then
  step "tuttirun -np 3 --gloo trainer"
  "$tuttirun" -np 3 --gloo "$trainer" --steps 150 > "$work/run3.log" 2>&1 ||
    { cat "$work/run3.log"; fail "tuttirun -np 3 --gloo trainer"; }
  cat "$work/run3.log"
  check_run "$work/run3.log" 3
fi

step "trainer (pkg-config build) as a world of one"
env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE "$work/trainer_pc" --steps 100 \
  > "$work/run1.log" 2>&1 || { cat "$work/run1.log"; fail "trainer without a launcher"; }
cat "$work/run1.log"
check_run "$work/run1.log" 1
echo "PASS"
