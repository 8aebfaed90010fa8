// The conformance suite (conformance.h) for the gloo backend, one process per rank under
// `tuttirun --gloo`. The large count (800 KiB) gives every member of a 2- or 3-rank ring
// more than one 256 KiB reduce-scatter segment. At 5 ranks it is 64 KiB: more than one
// segment each there would take 1.3 MiB and cost CI about 15 s on 2 cores for the path
// the smaller rings already take.
#include "backends/gloo/gloo_transport.h"
#include "test/conformance/conformance.h"
#include "test/gloo/gloo_test_util.h"

#include <cstdio>

int main() {
  using namespace tutti;
  const BackendOptions options = test::optionsFromEnv();
  try {
    auto transport = makeGlooTransport(options);
    test::ConformanceOptions suite;
    suite.label = "gloo";
    suite.large_bytes = options.size <= 3 ? 800 << 10 : 64 << 10;
    suite.deadline_seconds = options.timeout_seconds;
    return test::runConformanceProcess(*transport, suite);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo rank %d: error: %s\n", options.rank, e.what());
    return 2;
  }
}
