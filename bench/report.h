// tutti-bench's output: nccl-tests' table on stdout (rank 0), printed row by row as sizes
// finish, and the same rows as one JSON document (--json). Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace tutti {
namespace bench {

// One of a row's two halves (out-of-place, in-place).
struct ModeResult {
  bool present = false;  // false: Tutti's API has no such mode for this collective (N/A)
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;  // -1: not checked (-c 0)
  bool has_baseline = false;
  double base_time_us = 0, base_busbw = 0;
  int64_t base_wrong = -1;
};

struct SweepRow {
  int64_t bytes = 0;  // nccl-tests' size column: the larger of the send and receive buffers
  int64_t count = 0;  // elements per rank argument (nccl-tests' count column)
  std::string type, redop;
  int root = -1;
  ModeResult out_of_place, in_place;
  std::string backend;  // the backend(s) that moved this row's data ("shm"; "" unknown)
};

struct FusionRow {
  int tensors = 0;
  int64_t tensor_bytes = 0;
  double tutti_us = 0;          // one step: all enqueued, then all waited
  double tutti_grouped_us = 0;  // the same tensors as one groupedAllreduce
  bool has_baseline = false;
  double per_tensor_us = 0;  // bare backend, one call per tensor
  double packed_us = 0;      // bare backend, pack + one call + unpack
  int64_t wrong = -1;
};

struct LatencyStats {
  double median_us = 0, p99_us = 0, max_us = 0;
};

struct LatencyRow {
  int64_t bytes = 0;
  LatencyStats tutti;
  bool has_baseline = false;
  LatencyStats baseline;
  int64_t wrong = -1;
};

struct Metadata {
  // backend: what moved the data (shm, mpi, gloo, hierarchical, loopback), found by running
  // the workload's op (Runner::movedBy); transport: Tutti's CPU transport (cpuBackend()).
  std::string command, workload, backend, transport, baseline, date, hostname, cpu_model;
  std::string loadavg;  // /proc/loadavg at the start: other work on a shared machine
  int ranks = 1, cores = 0;
  std::string dtype, op, combine;
  int iters = 0, warmup_iters = 0, agg_iters = 1;
  bool check = true;
  bool cputime = false;  // -C: the time column is named "cputime", as nccl-tests names it
  double memcpy_gbps = 0;  // one core's memcpy bandwidth (measureMemcpy); 0 = not measured
};

// busbw / algbw for a collective over n ranks (nccl-tests' factors).
double busBandwidthFactor(const std::string& collective, int nranks);
// "12.34", "1234.5", "123456": at most 8 characters, like nccl-tests' time column.
std::string formatTime(double us);
// nccl-tests' number cells: "%.2f", else "%.1f", else "%.0f", else an exponent, whichever
// first fits `width` characters, right-aligned.
std::string fitNumber(double value, int width);
// Host name, /proc/cpuinfo model, cores and the UTC date, for the metadata.
void fillMachine(Metadata* meta);
// The machine's memory-copy limit: GB/s of payload one core's memcpy moves between two
// 64 MiB buffers (best of 5). The data plane's busbw is reported as a fraction of it.
double measureMemcpy();
// Median, 99th percentile and maximum of `samples` (sorted in place).
LatencyStats latencyStats(std::vector<double>* samples);

class Report {
 public:
  // `out` null: collect rows only (ranks other than 0).
  Report(Metadata meta, FILE* out);

  // The backend that moved the data, once a workload has found it (before its begin*).
  void setBackend(const std::string& backend) { meta_.backend = backend; }

  void beginSweep(bool with_baseline);
  void addSweepRow(const SweepRow& row);
  void beginFusion(bool with_baseline);
  void addFusionRow(const FusionRow& row);
  void beginLatency(bool with_baseline);
  void addLatencyRow(const LatencyRow& row);
  // Prints the "# Out of bounds values" and "# Avg bus bandwidth" trailer, and which
  // backend moved which sizes when rows were moved by another than the header names.
  void finish(int64_t total_wrong);

  double averageBusBandwidth() const;
  double bestBusBandwidth() const;  // the sweep's highest busbw, either mode
  std::string json() const;
  // Throws Error(kInvalidArgument) naming the path when it cannot be written.
  void writeJson(const std::string& path) const;

 private:
  void print(const char* fmt, ...) const __attribute__((format(printf, 2, 3)));
  void printMachine() const;
  void printMode(const ModeResult& m) const;
  void printBaseline(const ModeResult& m) const;
  void printRowBackends() const;
  std::string backendText() const;  // "shm (transport gloo)"

  Metadata meta_;
  FILE* out_;
  bool with_baseline_ = false;
  bool began_ = false;
  int64_t total_wrong_ = 0;
  std::vector<SweepRow> sweep_;
  std::vector<FusionRow> fusion_;
  std::vector<LatencyRow> latency_;
};

}  // namespace bench
}  // namespace tutti
