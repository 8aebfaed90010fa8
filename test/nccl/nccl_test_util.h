// Shared by the NCCL tests: a device buffer, deterministic per-rank inputs, and checks of
// every Backend op against a reference computed on the host with core/reduce.h. Every rank
// computes every rank's inputs locally, so the reference needs no communication.
#pragma once

#include "backends/backend.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tutti {
namespace test {

// The exit code of a test that found no CUDA device (CTest SKIP_RETURN_CODE).
constexpr int kSkipReturnCode = 77;

int cudaDeviceCountOrZero();

// cudaMalloc'd memory on the current device; at least 16 bytes, so never null.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  void upload(const std::vector<uint8_t>& host);
  std::vector<uint8_t> download(size_t bytes) const;

 private:
  void* ptr_ = nullptr;
};

// The dtypes NCCL reduces, and those it only moves.
std::vector<DataType> reductionTypes(const Backend& backend);
std::vector<DataType> movementTypes(const Backend& backend);

// One line per mismatch (rank, op, dtype, counts, first differing byte); empty = passed.
// No Catch macros inside, so threads-as-ranks can run the checks and report afterwards.
using Failures = std::vector<std::string>;

// Checks each op for each supported dtype and odd counts against the host reference.
// Collective: every member of the backend's group calls them in the same order.
Failures checkAllreduce(Backend& backend, Deadline deadline);
Failures checkAllgather(Backend& backend, Deadline deadline);
Failures checkBroadcast(Backend& backend, Deadline deadline);
Failures checkAlltoall(Backend& backend, Deadline deadline);
Failures checkReducescatter(Backend& backend, Deadline deadline);
// Argument errors are thrown before anything is enqueued and leave the backend usable.
Failures checkArgumentErrors(Backend& backend, Deadline deadline);

// Runs a check; an exception (a timeout, a backend error) becomes its one failure.
Failures runCheck(const std::function<Failures()>& check);

}  // namespace test
}  // namespace tutti
