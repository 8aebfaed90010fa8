// What every workload shares: this rank's place in the job, Tutti calls that throw on
// failure, persistent buffers, a clock, and the combination of per-rank numbers (-a).
// Used from the main thread only.
#pragma once

#include "bench/baseline.h"
#include "bench/options.h"

#include <tutti/tutti.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tutti {
namespace bench {

// Page-aligned memory, touched once at allocation so that timed loops never fault it in.
class Buffer {
 public:
  explicit Buffer(int64_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  char* data_ = nullptr;
  int64_t bytes_ = 0;
};

double nowUs();

class Runner {
 public:
  Runner(const Options& options, Baseline* baseline);

  const Options& options() const { return options_; }
  Baseline* baseline() const { return baseline_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Throws Error(status code, "tutti-bench: rank R: <what>: <message>") unless ok.
  void check(const Status& status, const std::string& what) const;
  // Waits (up to TUTTI_TIMEOUT_SECONDS) and checks; `result` may be null.
  void wait(Handle handle, const std::string& what, Result* result = nullptr) const;
  // An untimed Tutti barrier over all ranks.
  void barrier() const;
  // Combines each value over ranks as -a says: rank 0's, average, min or max.
  std::vector<double> combine(std::vector<double> values) const;
  std::vector<int64_t> sumOverRanks(std::vector<int64_t> values) const;
  // Warm-up before the first timed row (nccl-tests warms up too): 4-byte Tutti allreduces
  // until every rank has spent `seconds` in them, then as many bare ones. The first
  // ~50 ms after init are several times slower than steady state on both. Returns the
  // number of Tutti ops run.
  int settle(double seconds) const;

  // This rank's calls of `op` ("allreduce", ...) so far, by backend (the runtime's
  // "op.<op>.<backend>.calls" counters).
  std::map<std::string, int64_t> opCalls(const std::string& op) const;
  // The backend(s) whose calls of `op` grew since `before`, joined by "+"; "" if none did.
  std::string movedBy(const std::string& op, const std::map<std::string, int64_t>& before) const;
  // One 1-element allreduce of -d and -o: the backend that moves the allreduces of fusion
  // and latency (the runtime picks it by op and dtype; only broadcast sizes move elsewhere).
  std::string probeAllreduce() const;

 private:
  const Options& options_;
  Baseline* baseline_;
  int rank_ = 0;
  int size_ = 1;
};

// A 1-D view of `count` elements at `data`.
TensorView view(void* data, int64_t count, DataType dtype);
const char* timeCombineName(TimeCombine combine);

}  // namespace bench
}  // namespace tutti
