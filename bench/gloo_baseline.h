// gloo baseline: gloo::allreduce/allgather/broadcast/alltoall/barrier on a gloo context of
// its own (TCP pairs), beside Tutti's. The pairs' addresses are exchanged through a
// caller-given allgather of bytes (Tutti's own allgather in tutti-bench, MPI in the test),
// so no rendezvous server is needed. gloo has no options-style reduce-scatter: that row is N/A.
#pragma once

#include "bench/baseline.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tutti {
namespace bench {

// Every rank's `bytes`, in rank order; called collectively by all ranks.
using ExchangeFn = std::function<std::vector<std::string>(const std::string& bytes)>;

struct GlooBaselineConfig {
  int rank = 0;
  int size = 1;
  std::string iface;     // TCP interface (TUTTI_GLOO_IFACE); empty: use `hostname`
  std::string hostname;  // address to listen on; "127.0.0.1" for a single host
  double timeout_seconds = 300;
  ExchangeFn exchange;
};

std::unique_ptr<Baseline> makeGlooBaseline(const GlooBaselineConfig& config);

}  // namespace bench
}  // namespace tutti
