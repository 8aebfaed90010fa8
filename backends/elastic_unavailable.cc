// A build without the gloo transport has no elastic jobs (backends/elastic.h).
#include "backends/elastic.h"

#include "base/common.h"

namespace tutti {

bool elasticJob() { return false; }

int64_t elasticJoinedGeneration() { return -1; }

bool elasticLauncherGone() { return false; }

bool elasticHostsUpdated(const BackendOptions&) {
  throwError(StatusCode::kUnsupported,
             "elastic jobs need the gloo transport, which this build of Tutti lacks");
}

}  // namespace tutti
