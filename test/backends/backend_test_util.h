// Deterministic inputs and independent (double-precision) references for backend tests.
// Every rank can compute every rank's input from (rank, index, op), so a test checks its
// result without exchanging anything. Inputs are small integers chosen so that every
// reduction is exact in every dtype (no overflow, no rounding): a mismatch is a real bug.
#pragma once

#include "backends/backend.h"
#include "base/common.h"
#include "base/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace tutti {
namespace test {

inline const std::vector<DataType>& allDataTypes() {
  static const std::vector<DataType> all = {
      DataType::kUInt8,   DataType::kInt8,     DataType::kUInt16,  DataType::kInt16,
      DataType::kInt32,   DataType::kInt64,    DataType::kFloat16, DataType::kBFloat16,
      DataType::kFloat32, DataType::kFloat64,  DataType::kBool};
  return all;
}

inline const std::vector<ReduceOp>& allReduceOps() {
  static const std::vector<ReduceOp> all = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                                            ReduceOp::kProduct};
  return all;
}

inline bool isSigned(DataType dtype) {
  return dtype != DataType::kUInt8 && dtype != DataType::kUInt16 && dtype != DataType::kBool;
}

inline void storeValue(DataType dtype, void* buf, int64_t i, double v) {
  storeElement(buf, i, dtype, v);
}

inline double loadValue(DataType dtype, const void* buf, int64_t i) {
  return loadElement(buf, i, dtype);
}

// Input of `rank` (of `n`) at element i for a reduction with `op`, plus a `salt` that
// varies it between cases. Sums stay within [-40, 80], products are 1 except on one rank.
inline double inputValue(DataType dtype, ReduceOp op, int rank, int n, int64_t i, int salt) {
  if (dtype == DataType::kBool) return ((rank * 5 + i + salt) % 4) != 0 ? 1 : 0;
  if (op == ReduceOp::kProduct) {
    if ((i + salt) % n != rank) return 1;
    return (i % 2 && isSigned(dtype)) ? -1 : 2;
  }
  int64_t v = (rank * 7 + i * 3 + salt) % 11;
  return isSigned(dtype) ? static_cast<double>(v - 5) : static_cast<double>(v);
}

inline double reduceReference(DataType dtype, ReduceOp op, int n, int64_t i, int salt) {
  double acc = inputValue(dtype, op, 0, n, i, salt);
  for (int r = 1; r < n; ++r) {
    double v = inputValue(dtype, op, r, n, i, salt);
    bool logical = dtype == DataType::kBool;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc = logical ? double(acc || v) : acc + v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProduct: acc = logical ? double(acc && v) : acc * v; break;
    }
  }
  return acc;
}

// inputValue and reduceReference repeat in i with this period (bool: 4; product: 2n;
// otherwise 11), so large cases compute one period and repeat it.
inline int64_t inputPeriod(int n) { return std::lcm<int64_t>(4, 2 * int64_t{n}) * 11; }

inline std::vector<uint8_t> makeInput(DataType dtype, ReduceOp op, int rank, int n,
                                      int64_t count, int salt) {
  const int64_t esz = dataTypeSize(dtype), period = std::min(count, inputPeriod(n));
  std::vector<uint8_t> buf(static_cast<size_t>(std::max<int64_t>(count, 1) * esz));
  for (int64_t i = 0; i < period; ++i)
    storeValue(dtype, buf.data(), i, inputValue(dtype, op, rank, n, i, salt));
  for (int64_t i = period; i < count; i += period)
    std::memcpy(buf.data() + i * esz, buf.data(), std::min(period, count - i) * esz);
  return buf;
}

// Bytes that identify (rank, element): for data-movement ops. bool stays 0/1.
inline uint8_t patternByte(DataType dtype, int rank, int64_t byte_index, int salt) {
  uint8_t b = static_cast<uint8_t>((rank * 131 + byte_index * 7 + salt * 17 + 1) & 0xff);
  return dtype == DataType::kBool ? (b & 1) : b;
}

// Collects failures from rank threads (Catch2 assertions are not thread-safe).
class Failures {
 public:
  void add(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    list_.push_back(message);
  }
  std::vector<std::string> list() {
    std::lock_guard<std::mutex> lock(mu_);
    return list_;
  }
  std::string summary() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s = std::to_string(list_.size()) + " failure(s)";
    for (size_t i = 0; i < list_.size() && i < 10; ++i) s += "\n  " + list_[i];
    return s;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> list_;
};

// Runs fn(r) for r in 0..n-1, each on its own thread (threads as ranks), and joins them;
// an exception becomes a failure naming the thread.
inline void runThreads(int n, Failures& failures, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        failures.add("thread " + std::to_string(r) + " threw: " + e.what());
      }
    });
  for (auto& t : threads) t.join();
}

// Compares `got` element-wise with the reduction reference; reports the first mismatch.
inline void checkReduced(Failures& failures, const std::string& what, DataType dtype,
                         ReduceOp op, int n, const void* got, int64_t first, int64_t count,
                         int salt) {
  const int64_t period = inputPeriod(n);
  std::vector<double> reference(static_cast<size_t>(period));
  for (int64_t j = 0; j < period; ++j) reference[j] = reduceReference(dtype, op, n, j, salt);
  for (int64_t i = 0; i < count; ++i) {
    double expected = reference[(first + i) % period];
    double actual = loadValue(dtype, got, i);
    if (actual != expected) {
      failures.add(what + " " + dataTypeName(dtype) + " " + reduceOpName(op) + " element " +
                   std::to_string(first + i) + ": expected " + std::to_string(expected) +
                   ", got " + std::to_string(actual));
      return;
    }
  }
}

// Broadcast of `base` elements from every root, checked byte by byte on every member.
inline void checkBroadcastFromEveryRoot(Backend& backend, int rank, int n, int64_t base,
                                        DataType dtype, int salt, const std::string& what,
                                        Failures& failures, Deadline deadline) {
  const int64_t esz = dataTypeSize(dtype);
  for (int root = 0; root < n; ++root) {
    std::vector<uint8_t> buf(base * esz + 1, 0xEE);
    if (rank == root)
      for (int64_t b = 0; b < base * esz; ++b) buf[b] = patternByte(dtype, root, b, salt);
    backend.broadcast(buf.data(), base, dtype, root, deadline);
    for (int64_t b = 0; b < base * esz; ++b)
      if (buf[b] != patternByte(dtype, root, b, salt)) {
        failures.add("broadcast" + what + " root " + std::to_string(root) + ": wrong at byte " +
                     std::to_string(b));
        break;
      }
  }
}

// alltoallv where member i sends (base + i + 2j + salt) % (base + 2) elements to member j
// (some blocks empty), checked byte by byte.
inline void checkAlltoallv(Backend& backend, int rank, int n, int64_t base, DataType dtype,
                           int salt, const std::string& what, Failures& failures,
                           Deadline deadline) {
  const int64_t esz = dataTypeSize(dtype);
  auto sendCount = [&](int i, int j) { return (base + i + 2 * j + salt) % (base + 2); };
  std::vector<int64_t> send(n), recv(n);
  for (int j = 0; j < n; ++j) send[j] = sendCount(rank, j), recv[j] = sendCount(j, rank);
  int64_t send_total = std::accumulate(send.begin(), send.end(), int64_t{0});
  int64_t recv_total = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  std::vector<uint8_t> sbuf(send_total * esz + 1), rbuf(recv_total * esz + 1, 0xEE);
  for (int j = 0, off = 0; j < n; off += send[j] * esz, ++j)
    for (int64_t b = 0; b < send[j] * esz; ++b)
      sbuf[off + b] = patternByte(dtype, rank * 16 + j, b, salt);
  backend.alltoallv(sbuf.data(), send, rbuf.data(), recv, dtype, deadline);
  for (int j = 0, off = 0; j < n; off += recv[j] * esz, ++j)
    for (int64_t b = 0; b < recv[j] * esz; ++b)
      if (rbuf[off + b] != patternByte(dtype, j * 16 + rank, b, salt)) {
        failures.add("alltoallv" + what + ": block from rank " + std::to_string(j) +
                     " wrong at byte " + std::to_string(b));
        break;
      }
}

}  // namespace test
}  // namespace tutti
