// Helpers of the gloo process tests: the BackendOptions of tuttirun's environment (read here:
// backend tests do not depend on the core's parseConfig), value generators with exactly
// representable results, and a failure counter that makes the process exit non-zero.
#pragma once

#include "backends/options.h"
#include "base/common.h"
#include "base/reduce.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

// Stores double `v` (a small integer) as `dtype` at index i.
inline void storeValue(void* base, int64_t i, DataType dtype, double v) {
  storeElement(base, i, dtype, v);
}

inline double loadValue(const void* base, int64_t i, DataType dtype) {
  return loadElement(base, i, dtype);
}

inline bool isUnsigned(DataType dtype) {
  return dtype == DataType::kUInt8 || dtype == DataType::kUInt16 || dtype == DataType::kBool;
}

// Rank r's element i for reduce op `op`: small integers whose sum/min/max/product over up
// to 4 ranks is exact in every dtype (|sum| <= 12, |product| <= 16).
inline double inputValue(int r, int64_t i, DataType dtype, ReduceOp op, int salt) {
  const int64_t k = r * 5 + i * 3 + salt;
  if (dtype == DataType::kBool) return ((k * 7) % 3) != 0 ? 1 : 0;
  if (op == ReduceOp::kProduct) {
    static const double kSigned[] = {1, 2, -1}, kUnsigned[] = {1, 2, 1};
    return (isUnsigned(dtype) ? kUnsigned : kSigned)[k % 3];
  }
  return isUnsigned(dtype) ? static_cast<double>(k % 4) : static_cast<double>(k % 7 - 3);
}

// The reduction of every rank's value, computed here in double.
inline double referenceValue(int size, int64_t i, DataType dtype, ReduceOp op, int salt) {
  double acc = inputValue(0, i, dtype, op, salt);
  for (int r = 1; r < size; ++r) {
    double v = inputValue(r, i, dtype, op, salt);
    switch (op) {
      case ReduceOp::kSum: acc = dtype == DataType::kBool ? (acc || v) : acc + v; break;
      case ReduceOp::kMin: acc = dtype == DataType::kBool ? (acc && v) : std::min(acc, v); break;
      case ReduceOp::kMax: acc = dtype == DataType::kBool ? (acc || v) : std::max(acc, v); break;
      case ReduceOp::kProduct: acc = dtype == DataType::kBool ? (acc && v) : acc * v; break;
      default: break;
    }
  }
  return acc;
}

inline const std::vector<DataType>& allDataTypes() {
  static const std::vector<DataType> types = {
      DataType::kUInt8,   DataType::kInt8,     DataType::kUInt16,  DataType::kInt16,
      DataType::kInt32,   DataType::kInt64,    DataType::kFloat16, DataType::kBFloat16,
      DataType::kFloat32, DataType::kFloat64,  DataType::kBool};
  return types;
}

}  // namespace test
}  // namespace tutti
