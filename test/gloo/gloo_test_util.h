// Helpers of the gloo process tests: the BackendOptions of tuttirun's environment (read here:
// backend tests do not depend on the core's parseConfig) and a failure counter that makes
// the process exit non-zero. The data-plane cases are the conformance suite's
// (test/conformance).
#pragma once

#include "backends/options.h"
#include "base/common.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace tutti {
namespace test {

inline std::string envOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

inline BackendOptions optionsFromEnv() {
  BackendOptions c;
  c.rank = std::stoi(envOr("TUTTI_RANK", "0"));
  c.size = std::stoi(envOr("TUTTI_SIZE", "1"));
  c.launcher = "tuttirun";
  c.rendezvous_addr = envOr("TUTTI_RENDEZVOUS_ADDR", "");
  c.rendezvous_port = std::stoi(envOr("TUTTI_RENDEZVOUS_PORT", "0"));
  c.secret = envOr("TUTTI_SECRET", "");
  const std::string file = envOr("TUTTI_SECRET_FILE", "");
  if (c.secret.empty() && !file.empty()) {
    std::ifstream in(file);
    std::getline(in, c.secret);
  }
  c.gloo_iface = envOr("TUTTI_GLOO_IFACE", "");
  c.timeout_seconds = std::stod(envOr("TUTTI_TIMEOUT_SECONDS", "60"));
  c.cpu_operations = "gloo";
  return c;
}

// Counts failed checks; the first few are printed with the rank.
class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}
  void check(bool ok, const std::string& what) {
    ++checks_;
    if (ok) return;
    if (++failures_ <= 20) std::fprintf(stderr, "rank %d: FAILED %s\n", rank_, what.c_str());
  }
  int finish(const char* name) const {
    std::printf("rank %d: %s: %d checks, %d failures\n", rank_, name, checks_, failures_);
    std::fflush(stdout);
    return failures_ == 0 ? 0 : 1;
  }

 private:
  int rank_;
  int checks_ = 0;
  int failures_ = 0;
};

}  // namespace test
}  // namespace tutti
