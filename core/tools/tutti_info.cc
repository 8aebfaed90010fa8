// tutti-info: what this build of Tutti has, and its settings table.
//   tutti-info            backends built, the topology, and every setting in force with
//                         where its value came from (default, environment, tuttirun)
//   tutti-info --env-markdown   the TUTTI_* table as Markdown (docs/env_vars.md embeds it)
// It stays on the internal library (tutti_internal), not the C API: the settings table with
// each value's source (core/config.h) and the backend registry are internals that no public
// call exposes, and publishing them would freeze what is only a diagnostic.
#include "backends/registry.h"
#include "base/common.h"
#include "core/config.h"

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--env-markdown") == 0) {
    std::fputs(tutti::configMarkdown().c_str(), stdout);
    return 0;
  }
  if (argc > 1) {
    std::fprintf(stderr, "usage: tutti-info [--env-markdown]\n");
    return 2;
  }
  std::printf("Tutti %s\nbackends built:", TUTTI_VERSION_STRING);
  for (const auto& name : tutti::builtBackends()) std::printf(" %s", name.c_str());
  std::printf("\n");
  try {
    tutti::Config c = tutti::parseConfig();
    std::printf("topology: rank %d of %d (%s)\n", c.topology.rank, c.topology.size,
                c.topology.source.c_str());
    std::printf("settings in force:\n");
    for (const auto& line : tutti::settingsInForce(c)) std::printf("  %s\n", line.c_str());
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "tutti-info: %s\n", e.what());
    return 1;
  }
  return 0;
}
