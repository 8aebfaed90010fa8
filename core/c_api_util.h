// Shared by the C API's files (core/c_api*.cc): every failure leaves its detail in a
// thread-local string for tutti_last_error(), and no exception crosses the C edge.
#pragma once

#include "base/common.h"

#include <tutti/tutti.h>

#include <exception>
#include <string>

namespace tutti {
namespace capi {

std::string& lastError();  // this thread's (core/c_api.cc)

inline tutti_status_t report(const Status& s) {
  lastError() = s.ok() ? std::string() : s.message();
  return static_cast<tutti_status_t>(s.code());
}

inline tutti_status_t invalid(const std::string& message) {
  return report(Status(StatusCode::kInvalidArgument, message));
}

template <typename F>
tutti_status_t guarded(F&& f) {
  try {
    return report(f());
  } catch (const std::exception& e) {
    return report(Status(StatusCode::kInternal, e.what()));
  } catch (...) {
    return report(Status(StatusCode::kInternal, "unknown exception"));
  }
}

}  // namespace capi
}  // namespace tutti
