#include "test/nccl/nccl_test_util.h"

#include "base/reduce.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <sstream>

namespace tutti {
namespace test {

namespace {

const std::vector<int64_t> kCounts = {0, 1, 7, 1023, 1025};
const ReduceOp kReduceOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

bool isSigned(DataType dtype) {
  return dtype != DataType::kUInt8 && dtype != DataType::kUInt16 && dtype != DataType::kBool;
}

void encode(double value, DataType dtype, uint8_t* dst) {
  switch (dtype) {
    case DataType::kUInt8: *dst = static_cast<uint8_t>(value); return;
    case DataType::kBool: *dst = value != 0 ? 1 : 0; return;
    case DataType::kInt8: *reinterpret_cast<int8_t*>(dst) = static_cast<int8_t>(value); return;
    case DataType::kUInt16: {
      uint16_t v = static_cast<uint16_t>(value);
      std::memcpy(dst, &v, 2);
      return;
    }
    case DataType::kInt16: {
      int16_t v = static_cast<int16_t>(value);
      std::memcpy(dst, &v, 2);
      return;
    }
    case DataType::kInt32: {
      int32_t v = static_cast<int32_t>(value);
      std::memcpy(dst, &v, 4);
      return;
    }
    case DataType::kInt64: {
      int64_t v = static_cast<int64_t>(value);
      std::memcpy(dst, &v, 8);
      return;
    }
    case DataType::kFloat16: {
      uint16_t v = floatToHalf(static_cast<float>(value));
      std::memcpy(dst, &v, 2);
      return;
    }
    case DataType::kBFloat16: {
      uint16_t v = floatToBfloat16(static_cast<float>(value));
      std::memcpy(dst, &v, 2);
      return;
    }
    case DataType::kFloat32: {
      float v = static_cast<float>(value);
      std::memcpy(dst, &v, 4);
      return;
    }
    case DataType::kFloat64: std::memcpy(dst, &value, 8); return;
  }
}

// Small integers, so every reduction order gives the same exact result in every dtype:
// sums stay within +-10 and products within +-16 for up to 5 ranks.
double reduceValue(int rank, int64_t i, DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) return (rank + 2 * i) % 3 != 0 ? 1 : 0;
  if (op == ReduceOp::kProduct) {
    static const double kSigned[] = {1, 2, -1};
    return isSigned(dtype) ? kSigned[(rank + i) % 3] : (rank + i) % 2 + 1;
  }
  double v = static_cast<double>((rank * 7 + i * 3) % 5);
  return isSigned(dtype) ? v - 2 : v;
}

// Distinct small values for data movement, exact in bfloat16 (< 256).
double moveValue(int64_t seed, int64_t i, DataType dtype) {
  if (dtype == DataType::kBool) return (seed + i) % 2;
  double v = static_cast<double>((seed * 131 + i * 7) % 97);
  return isSigned(dtype) ? v - 48 : v;
}

template <typename Fn>
std::vector<uint8_t> makeHost(int64_t count, DataType dtype, Fn value) {
  int64_t bytes = dataTypeSize(dtype);
  std::vector<uint8_t> host(static_cast<size_t>(count * bytes));
  for (int64_t i = 0; i < count; ++i) encode(value(i), dtype, host.data() + i * bytes);
  return host;
}

std::vector<uint8_t> reduceInputs(int rank, int64_t count, DataType dtype, ReduceOp op) {
  return makeHost(count, dtype, [&](int64_t i) { return reduceValue(rank, i, dtype, op); });
}

// The element-wise reduction over all ranks' inputs, with the core's own kernels.
std::vector<uint8_t> reduceReference(int size, int64_t count, DataType dtype, ReduceOp op) {
  std::vector<uint8_t> acc = reduceInputs(0, count, dtype, op);
  for (int r = 1; r < size; ++r) {
    std::vector<uint8_t> in = reduceInputs(r, count, dtype, op);
    reduceInto(acc.data(), in.data(), count, dtype, op);
  }
  return acc;
}

// Records where `got` first differs from `expected`.
void expectBytes(Failures& failures, const std::vector<uint8_t>& got,
                 const std::vector<uint8_t>& expected, const std::string& what) {
  if (got == expected) return;
  size_t i = 0;
  while (i < got.size() && i < expected.size() && got[i] == expected[i]) ++i;
  std::ostringstream message;
  message << what << ": " << got.size() << " bytes, expected " << expected.size();
  if (i < got.size() && i < expected.size())
    message << "; first difference at byte " << i << ": got " << int(got[i]) << ", expected "
            << int(expected[i]);
  failures.push_back(message.str());
}

}  // namespace

int cudaDeviceCountOrZero() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return devices;
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  cudaError_t result = cudaMalloc(&ptr_, bytes < 16 ? 16 : bytes);
  if (result != cudaSuccess)
    throwError(StatusCode::kInternal, std::string("test cudaMalloc of ") + std::to_string(bytes) +
                                          " bytes failed: " + cudaGetErrorString(result));
  cudaMemset(ptr_, 0xA5, bytes < 16 ? 16 : bytes);  // garbage the op must overwrite
}

DeviceBuffer::~DeviceBuffer() { cudaFree(ptr_); }

void DeviceBuffer::upload(const std::vector<uint8_t>& host) {
  cudaError_t result = cudaMemcpy(ptr_, host.data(), host.size(), cudaMemcpyHostToDevice);
  if (result != cudaSuccess)
    throwError(StatusCode::kInternal, std::string("test upload: ") + cudaGetErrorString(result));
}

std::vector<uint8_t> DeviceBuffer::download(size_t bytes) const {
  std::vector<uint8_t> host(bytes);
  cudaError_t result = cudaMemcpy(host.data(), ptr_, bytes, cudaMemcpyDeviceToHost);
  if (result != cudaSuccess)
    throwError(StatusCode::kInternal, std::string("test download: ") + cudaGetErrorString(result));
  return host;
}

std::vector<DataType> reductionTypes(const Backend& backend) {
  std::vector<DataType> types;
  for (int t = 0; t < kNumDataTypes; ++t)
    if (backend.supports(OpType::kAllreduce, static_cast<DataType>(t), DeviceType::kCuda))
      types.push_back(static_cast<DataType>(t));
  return types;
}

std::vector<DataType> movementTypes(const Backend& backend) {
  std::vector<DataType> types;
  for (int t = 0; t < kNumDataTypes; ++t)
    if (backend.supports(OpType::kAllgather, static_cast<DataType>(t), DeviceType::kCuda))
      types.push_back(static_cast<DataType>(t));
  return types;
}

Failures checkAllreduce(Backend& backend, Deadline deadline) {
  Failures failures;
  for (DataType dtype : reductionTypes(backend))
    for (ReduceOp op : kReduceOps)
      for (int64_t count : kCounts) {
        std::ostringstream what;
        what << "rank " << backend.rank() << " allreduce " << dataTypeName(dtype) << " "
             << reduceOpName(op) << " count " << count;
        size_t bytes = static_cast<size_t>(count * dataTypeSize(dtype));
        std::vector<uint8_t> expected = reduceReference(backend.size(), count, dtype, op);
        DeviceBuffer in(bytes), out(bytes);
        in.upload(reduceInputs(backend.rank(), count, dtype, op));
        backend.allreduce(in.get(), out.get(), count, dtype, op, deadline);
        expectBytes(failures, out.download(bytes), expected, what.str());
        backend.allreduce(in.get(), in.get(), count, dtype, op, deadline);  // in place
        expectBytes(failures, in.download(bytes), expected, what.str());
      }
  return failures;
}

Failures checkAllgather(Backend& backend, Deadline deadline) {
  Failures failures;
  int size = backend.size(), rank = backend.rank();
  for (DataType dtype : movementTypes(backend))
    for (int64_t n : kCounts)
      for (bool equal : {true, false}) {
        std::vector<int64_t> counts(size);
        for (int r = 0; r < size; ++r) counts[r] = equal ? n : (n + r) % 1031;
        std::ostringstream what;
        what << "rank " << rank << " allgather " << dataTypeName(dtype) << " n " << n
             << (equal ? " equal" : " unequal");
        std::vector<uint8_t> expected;
        for (int r = 0; r < size; ++r) {
          auto block =
              makeHost(counts[r], dtype, [&](int64_t i) { return moveValue(r, i, dtype); });
          expected.insert(expected.end(), block.begin(), block.end());
        }
        DeviceBuffer in(counts[rank] * dataTypeSize(dtype)), out(expected.size());
        in.upload(
            makeHost(counts[rank], dtype, [&](int64_t i) { return moveValue(rank, i, dtype); }));
        backend.allgatherv(in.get(), out.get(), counts, dtype, deadline);
        expectBytes(failures, out.download(expected.size()), expected, what.str());
      }
  return failures;
}

Failures checkBroadcast(Backend& backend, Deadline deadline) {
  Failures failures;
  for (DataType dtype : movementTypes(backend))
    for (int64_t count : kCounts)
      for (int root = 0; root < backend.size(); ++root) {
        std::ostringstream what;
        what << "rank " << backend.rank() << " broadcast " << dataTypeName(dtype) << " count "
             << count << " root " << root;
        auto expected =
            makeHost(count, dtype, [&](int64_t i) { return moveValue(root, i, dtype); });
        DeviceBuffer buf(expected.size());
        if (backend.rank() == root) buf.upload(expected);
        backend.broadcast(buf.get(), count, dtype, root, deadline);
        expectBytes(failures, buf.download(expected.size()), expected, what.str());
      }
  return failures;
}

Failures checkAlltoall(Backend& backend, Deadline deadline) {
  Failures failures;
  int size = backend.size(), me = backend.rank();
  // What `from` sends to `to`: equal blocks of n, or (from + to + n) % 4 elements.
  auto block = [](int from, int to, int64_t n, bool equal) {
    return equal ? n : (from + to + n) % 4;
  };
  for (DataType dtype : movementTypes(backend))
    for (int64_t n : kCounts)
      for (bool equal : {true, false}) {
        std::ostringstream what;
        what << "rank " << me << " alltoall " << dataTypeName(dtype) << " n " << n
             << (equal ? " equal" : " unequal");
        std::vector<int64_t> send_counts(size), recv_counts(size);
        std::vector<uint8_t> send, expected;
        for (int peer = 0; peer < size; ++peer) {
          send_counts[peer] = block(me, peer, n, equal);
          recv_counts[peer] = block(peer, me, n, equal);
          auto out = makeHost(send_counts[peer], dtype,
                              [&](int64_t i) { return moveValue(me * 31 + peer, i, dtype); });
          auto in = makeHost(recv_counts[peer], dtype,
                             [&](int64_t i) { return moveValue(peer * 31 + me, i, dtype); });
          send.insert(send.end(), out.begin(), out.end());
          expected.insert(expected.end(), in.begin(), in.end());
        }
        DeviceBuffer in(send.size()), out(expected.size());
        in.upload(send);
        backend.alltoallv(in.get(), send_counts, out.get(), recv_counts, dtype, deadline);
        expectBytes(failures, out.download(expected.size()), expected, what.str());
      }
  return failures;
}

Failures checkReducescatter(Backend& backend, Deadline deadline) {
  Failures failures;
  int size = backend.size(), rank = backend.rank();
  for (DataType dtype : reductionTypes(backend))
    for (ReduceOp op : kReduceOps)
      for (int64_t n : kCounts)
        for (bool equal : {true, false}) {
          std::vector<int64_t> counts(size);
          int64_t total = 0, offset = 0;
          for (int r = 0; r < size; ++r) {
            counts[r] = equal ? n : (n + 2 * r) % 1027;
            if (r < rank) offset += counts[r];
            total += counts[r];
          }
          std::ostringstream what;
          what << "rank " << rank << " reducescatter " << dataTypeName(dtype) << " "
               << reduceOpName(op) << " n " << n << (equal ? " equal" : " unequal");
          int64_t bytes = dataTypeSize(dtype);
          std::vector<uint8_t> full = reduceReference(size, total, dtype, op);
          std::vector<uint8_t> expected(full.begin() + offset * bytes,
                                        full.begin() + (offset + counts[rank]) * bytes);
          DeviceBuffer in(total * bytes), out(expected.size());
          in.upload(reduceInputs(rank, total, dtype, op));
          backend.reducescatter(in.get(), out.get(), counts, dtype, op, deadline);
          expectBytes(failures, out.download(expected.size()), expected, what.str());
        }
  return failures;
}

Failures checkArgumentErrors(Backend& backend, Deadline deadline) {
  Failures failures;
  // Runs `call` and records a failure unless it throws Error with `expected`.
  auto expectCode = [&](StatusCode expected, const char* what, auto&& call) {
    StatusCode got = StatusCode::kOk;
    std::string message;
    try {
      call();
    } catch (const Error& error) {
      got = error.code();
      message = error.what();
    }
    if (got != expected)
      failures.push_back("rank " + std::to_string(backend.rank()) + " " + what +
                         ": expected status " + std::to_string(static_cast<int>(expected)) +
                         ", got " + std::to_string(static_cast<int>(got)) + " " + message);
  };
  DeviceBuffer buf(64);
  std::vector<int64_t> wrong(backend.size() + 1, 1);
  expectCode(StatusCode::kInvalidArgument, "allgather with one count too many", [&] {
    backend.allgatherv(buf.get(), buf.get(), wrong, DataType::kFloat32, deadline);
  });
  expectCode(StatusCode::kInvalidArgument, "allreduce of -1 elements", [&] {
    backend.allreduce(buf.get(), buf.get(), -1, DataType::kFloat32, ReduceOp::kSum, deadline);
  });
  expectCode(StatusCode::kInvalidArgument, "allreduce with average", [&] {
    backend.allreduce(buf.get(), buf.get(), 4, DataType::kFloat32, ReduceOp::kAverage, deadline);
  });
  expectCode(StatusCode::kUnsupported, "allreduce of int16", [&] {
    backend.allreduce(buf.get(), buf.get(), 4, DataType::kInt16, ReduceOp::kSum, deadline);
  });
  std::vector<float> host(4, 1.0f);
  expectCode(StatusCode::kInvalidArgument, "allreduce of host memory", [&] {
    backend.allreduce(host.data(), host.data(), 4, DataType::kFloat32, ReduceOp::kSum, deadline);
  });
  expectCode(StatusCode::kInvalidArgument, "broadcast from root == size", [&] {
    backend.broadcast(buf.get(), 4, DataType::kFloat32, backend.size(), deadline);
  });
  // None of these poisoned the communicator.
  expectCode(StatusCode::kOk, "barrier after the argument errors",
             [&] { backend.barrier(deadline); });
  return failures;
}

Failures runCheck(const std::function<Failures()>& check) {
  try {
    return check();
  } catch (const std::exception& error) {
    return {std::string("threw: ") + error.what()};
  }
}

}  // namespace test
}  // namespace tutti
