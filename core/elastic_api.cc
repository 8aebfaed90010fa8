// Elastic jobs behind the C API (core/api.h; docs/elastic.md): the recoverable-failure test
// and the host-update query. The generations themselves are joined at init by the gloo
// transport, which also defines elasticJoinedGeneration() (backends/elastic.h).
#include "backends/elastic.h"
#include "base/common.h"
#include "core/api.h"
#include "core/config.h"

namespace tutti {
namespace api {

bool isRecoverable(StatusCode code) {
  if (!elasticJob() || elasticLauncherGone()) return false;
  switch (code) {
    case StatusCode::kAborted:
    case StatusCode::kBackend:
    case StatusCode::kTimeout:
      return true;
    default:
      return false;
  }
}

Status hostsUpdated(bool* updated) {
  if (updated == nullptr)
    return Status(StatusCode::kInvalidArgument, "hostsUpdated: updated is null");
  *updated = false;
  try {
    // the launcher's settings do not change
    static const BackendOptions options = backendOptions(parseConfig());
    *updated = elasticHostsUpdated(options);
    return Status::OK();
  } catch (const Error& e) {
    return e.status();
  }
}

}  // namespace api
}  // namespace tutti
