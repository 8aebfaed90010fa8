#!/usr/bin/env bash
# The layers of docs/architecture.md ("Layers"), checked on every #include of the sources:
#   include/   the public headers (include/tutti/): only each other and the standard library
#   base/      includes nothing from core/ or backends/ (of the layers above, only the public
#              tutti/ headers, which live outside core/)
#   backends/  includes nothing from core/; backends/shm/ nothing from backends/hierarchical/
#              (hierarchical is composed of shm; the registry puts the two together)
#   core/      includes from backends/ only the contracts: backend.h, registry.h, elastic.h,
#              options.h
#   frameworks/ includes none of them, and of the public headers only the C API, tutti/tutti.h
#              (an adapter is compiled with its framework's C++ ABI: no C++ type may cross)
#   bench/     (tutti-bench) likewise: a program on the public API, as a user's is; its
#              CMakeLists.txt links libtutti.so, never tutti_internal
# Prints one line per include that breaks a rule (file:line, the include, the rule) and
# exits 1 when there is any. Usage: layering.sh SOURCE_DIR
set -euo pipefail
root=${1:?usage: layering.sh SOURCE_DIR}
cd "$root"
for dir in include/tutti base backends core frameworks bench; do
  [ -d "$dir" ] || { echo "layering: $root/$dir is missing" >&2; exit 2; }
done

contracts='backends/(backend|registry|elastic|options)\.h'
include='^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]'
bad=0
# report RULE: each "file:line:text" line on stdin breaks RULE.
report() {
  local hit file rest
  while IFS= read -r hit; do
    [ -n "$hit" ] || continue
    file=${hit%%:*}
    rest=${hit#*:}
    echo "layering: $file:${rest%%:*}: $(sed 's/^[[:space:]]*//' <<<"${rest#*:}"): $1"
    bad=1
  done
}
includes() {  # DIR TARGET_PATTERN: the includes under DIR whose target matches
  grep -rnE --include='*.h' --include='*.hpp' --include='*.cc' --include='*.cu' "${include}($2)" "$1" || true
}
report "include/tutti/ is the public API: its headers include only each other (<tutti/...>) and the standard library" \
  < <(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*(\"|<(base|core|backends|frameworks)/)" include || true)
report "base/ is the bottom layer: it may include only base/ and the public tutti/ headers" \
  < <(includes base 'core/|backends/')
report "backends/ may include base/ and backends/, never core/ (what a backend needs from the Config goes into BackendOptions, backends/options.h)" \
  < <(includes backends 'core/')
report "backends/shm/ may not include backends/hierarchical/ (hierarchical stands on shm; backends/registry.cc composes them)" \
  < <(includes backends/shm 'backends/hierarchical/')
report "core/ may include from backends/ only the contracts backend.h, registry.h, elastic.h and options.h" \
  < <(includes core 'backends/' | grep -vE "[\"<]${contracts}[\">]")
report "frameworks/ use the public API only (tutti/tutti.h, tutti/tutti.hpp)" \
  < <(includes frameworks 'base/|core/|backends/')
report "frameworks/ stand on the C API only (tutti/tutti.h): an adapter is built with its framework's C++ ABI, so no C++ type of tutti.hpp may cross into libtutti" \
  < <(includes frameworks 'tutti/tutti\.hpp')
report "bench/ (tutti-bench) uses the public API only (tutti/tutti.h, tutti/tutti.hpp), its own bench/ headers, MPI and gloo" \
  < <(includes bench 'base/|core/|backends/')
report "tutti-bench links libtutti.so (target tutti), as a user's program does, not the internal library" \
  < <(grep -rnE --include=CMakeLists.txt '\btutti_internal\b' bench || true)
if [ "$bad" -ne 0 ]; then
  echo "layering: FAILED (docs/architecture.md, \"Layers\", says where each piece belongs)"
  exit 1
fi
echo "layering: include/, base/, backends/, core/, frameworks/ and bench/ include only what their layer may"
