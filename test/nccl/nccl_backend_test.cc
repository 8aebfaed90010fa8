// The NCCL backend in one process, bootstrapped over the loopback control plane. Without a
// CUDA device only the [no-gpu] cases run (the factory must decline, on every thread-rank
// together; the dtype/op tables are checked), and the binary exits with kSkipReturnCode so
// CTest reports "Skipped".
#define CATCH_CONFIG_RUNNER
#include "test/catch.h"
#include <cuda_runtime_api.h>

#include "backends/loopback/loopback.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/nccl/nccl_types.h"
#include "base/reduce.h"
#include "test/nccl/nccl_test_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <thread>

namespace tutti {
namespace {

using detail::ncclReduceOp;
using detail::ncclSupports;
using detail::ncclWireType;

constexpr double kTimeoutSeconds = 120.0;

TEST_CASE("supports() accepts CUDA tensors of the dtypes NCCL carries", "[no-gpu]") {
  const int v = NCCL_VERSION_CODE;
  for (int t = 0; t < kNumDataTypes; ++t)
    for (int o = 0; o < kNumOpTypes; ++o)
      CHECK_FALSE(
          ncclSupports(static_cast<OpType>(o), static_cast<DataType>(t), DeviceType::kCpu, v));
  for (DataType dtype :
       {DataType::kUInt8, DataType::kInt8, DataType::kInt32, DataType::kInt64, DataType::kFloat16,
        DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64, DataType::kBool})
    for (OpType op : {OpType::kAllreduce, OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                      OpType::kReducescatter, OpType::kBarrier}) {
      INFO(dataTypeName(dtype) << " " << opTypeName(op));
      CHECK(ncclSupports(op, dtype, DeviceType::kCuda, v));
    }
  for (DataType dtype : {DataType::kUInt16, DataType::kInt16}) {
    CHECK_FALSE(ncclSupports(OpType::kAllreduce, dtype, DeviceType::kCuda, v));
    CHECK_FALSE(ncclSupports(OpType::kReducescatter, dtype, DeviceType::kCuda, v));
    CHECK(ncclSupports(OpType::kAllgather, dtype, DeviceType::kCuda, v));
    CHECK(ncclSupports(OpType::kBroadcast, dtype, DeviceType::kCuda, v));
    CHECK(ncclSupports(OpType::kAlltoall, dtype, DeviceType::kCuda, v));
  }
  CHECK_FALSE(ncclSupports(OpType::kJoin, DataType::kFloat32, DeviceType::kCuda, v));
  // bfloat16 needs NCCL 2.10.
  CHECK_FALSE(ncclSupports(OpType::kAllreduce, DataType::kBFloat16, DeviceType::kCuda, 2908));
  CHECK(ncclSupports(OpType::kAllreduce, DataType::kBFloat16, DeviceType::kCuda, 21000));
}

TEST_CASE("dtypes travel as the matching NCCL type; 16-bit ints as byte pairs", "[no-gpu]") {
  const int v = NCCL_VERSION_CODE;
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kFloat32, v).type == ncclFloat32);
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kFloat64, v).type == ncclFloat64);
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kFloat16, v).type == ncclFloat16);
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kBFloat16, v).type == ncclBfloat16);
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kInt8, v).type == ncclInt8);
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kUInt8, v).type == ncclUint8);
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kInt32, v).type == ncclInt32);
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kInt64, v).type == ncclInt64);
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kBool, v).type == ncclUint8);
  auto pair = ncclWireType(OpType::kAlltoall, DataType::kInt16, v);
  CHECK(pair.type == ncclUint8);
  CHECK(pair.items_per_element == 2);
  CHECK(ncclWireType(OpType::kAllreduce, DataType::kFloat32, v).items_per_element == 1);
  try {
    ncclWireType(OpType::kAllreduce, DataType::kUInt16, v);
    FAIL("uint16 allreduce should be unsupported");
  } catch (const Error& error) {
    CHECK(error.code() == StatusCode::kUnsupported);
    CHECK(std::string(error.what()).find("allreduce of uint16") != std::string::npos);
  }
}

TEST_CASE("reduce ops map to NCCL's; bool reduces as or/and", "[no-gpu]") {
  CHECK(ncclReduceOp(ReduceOp::kSum, DataType::kFloat32) == ncclSum);
  CHECK(ncclReduceOp(ReduceOp::kMin, DataType::kInt32) == ncclMin);
  CHECK(ncclReduceOp(ReduceOp::kMax, DataType::kInt64) == ncclMax);
  CHECK(ncclReduceOp(ReduceOp::kProduct, DataType::kFloat16) == ncclProd);
  CHECK(ncclReduceOp(ReduceOp::kSum, DataType::kBool) == ncclMax);
  CHECK(ncclReduceOp(ReduceOp::kMax, DataType::kBool) == ncclMax);
  CHECK(ncclReduceOp(ReduceOp::kMin, DataType::kBool) == ncclMin);
  CHECK(ncclReduceOp(ReduceOp::kProduct, DataType::kBool) == ncclMin);
  CHECK_THROWS_AS(ncclReduceOp(ReduceOp::kAverage, DataType::kFloat32), Error);
  CHECK(detail::ncclVersionString(22809) == "2.28.9");
  CHECK(detail::ncclVersionString(2708) == "2.7.8");
}

TEST_CASE("scaling on the device: ncclAvg, PreMulSum or a refusal that says why", "[no-gpu]") {
  using Plan = detail::NcclScalingPlan;
  auto plan = [](DataType dtype, ReduceOp op, double pre, double post, int64_t divisor,
                 int members = 4, int version = 22809) {
    ReduceScaling scaling;
    scaling.prescale = pre;
    scaling.postscale = post;
    scaling.divisor = divisor;
    return detail::ncclScalingPlan(dtype, op, scaling, members, version);
  };
  CHECK(plan(DataType::kFloat32, ReduceOp::kSum, 1, 1, 1).kind == Plan::kPlain);
  CHECK(plan(DataType::kFloat32, ReduceOp::kMax, 1, 1, 1).kind == Plan::kPlain);
  CHECK(plan(DataType::kBool, ReduceOp::kSum, 0.5, 3, 4).kind == Plan::kPlain);  // as on the CPU
  for (DataType dtype : {DataType::kFloat32, DataType::kInt32, DataType::kUInt8})
    CHECK(plan(dtype, ReduceOp::kSum, 1, 1, 4).kind == Plan::kAverage);
  auto scaled = plan(DataType::kFloat16, ReduceOp::kSum, 0.5, 3, 4);
  CHECK(scaled.kind == Plan::kPreMulSum);
  CHECK(scaled.factor == 0.375);
  CHECK(plan(DataType::kFloat64, ReduceOp::kSum, 1, 1, 2, /*members=*/3).factor == 0.5);
  CHECK(plan(DataType::kInt64, ReduceOp::kSum, 3, -2, 1).factor == -6);
  auto refused = plan(DataType::kFloat32, ReduceOp::kMin, 2, 1, 1);
  CHECK(refused.kind == Plan::kUnsupported);
  CHECK(refused.why == "scale factors with min on CUDA tensors (only sum and average can be scaled "
                       "on the device)");
  CHECK(plan(DataType::kInt32, ReduceOp::kSum, 0.5, 1, 1).why ==
        "scale factors on int32 CUDA tensors must multiply to an integer, without an average");
  CHECK(plan(DataType::kInt32, ReduceOp::kSum, 2, 1, 4).kind == Plan::kUnsupported);
  CHECK(plan(DataType::kUInt8, ReduceOp::kSum, -1, 1, 1).why ==
        "scale factors on uint8 CUDA tensors must multiply to an integer >= 0, without an average");
  CHECK(plan(DataType::kFloat32, ReduceOp::kSum, 2, 1, 1, 4, 21000).why ==
        "scaling CUDA tensors needs NCCL 2.11.0 (this is 2.10.0)");
  CHECK(plan(DataType::kFloat32, ReduceOp::kSum, 1, 1, 4, 4, 21000).kind == Plan::kAverage);
}

// A group of all ranks of a loopback world, for one thread-rank.
struct LoopbackGroup {
  LoopbackGroup(std::shared_ptr<LoopbackHub> hub, int rank, int size)
      : transport(makeLoopbackTransport(std::move(hub), rank)) {
    std::vector<int> ranks(size);
    for (int r = 0; r < size; ++r) ranks[r] = r;
    control = transport->makeControlPlane(ranks, 0);
  }
  std::unique_ptr<Transport> transport;
  std::unique_ptr<ControlPlane> control;
};

TEST_CASE("without a CUDA device the factory declines on every rank together", "[no-gpu]") {
  if (test::cudaDeviceCountOrZero() > 0) return;  // the [gpu] cases cover this machine
  for (int size : {1, 2, 3}) {
    auto hub = makeLoopbackHub(size);
    std::vector<int> declined(size, 0);
    std::vector<std::string> errors(size);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < size; ++rank)
      threads.emplace_back([&, rank] {
        try {
          LoopbackGroup group(hub, rank, size);
          BackendOptions options;
          options.timeout_seconds = kTimeoutSeconds;
          options.rank = options.local_rank = rank;
          options.size = size;
          declined[rank] = makeNcclBackend(*group.control, options) == nullptr;
        } catch (const std::exception& error) {
          errors[rank] = error.what();
        }
      });
    for (auto& thread : threads) thread.join();
    for (int rank = 0; rank < size; ++rank) {
      INFO("world of " << size << ", rank " << rank << ": " << errors[rank]);
      CHECK(errors[rank].empty());
      CHECK(declined[rank]);
    }
  }
}

// A backend for a world of one (local rank 0, so CUDA device 0).
struct SoloBackend {
  SoloBackend() : group(makeLoopbackHub(1), 0, 1) {
    BackendOptions options;
    options.timeout_seconds = kTimeoutSeconds;
    backend = makeNcclBackend(*group.control, options);
    REQUIRE(backend != nullptr);
    REQUIRE(backend->rank() == 0);
    REQUIRE(backend->size() == 1);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);  // the test's buffers go where NCCL runs
  }
  LoopbackGroup group;
  std::unique_ptr<Backend> backend;
};

// Fails the current test case with every mismatch a check found.
void report(const test::Failures& failures) {
  for (const auto& failure : failures) FAIL_CHECK(failure);
  CHECK(failures.empty());
}

using CheckFn = test::Failures (*)(Backend&, Deadline);
const CheckFn kChecks[] = {test::checkAllreduce,     test::checkAllgather,
                           test::checkBroadcast,     test::checkAlltoall,
                           test::checkReducescatter, test::checkArgumentErrors};

TEST_CASE("every op matches the host reference in a group of one", "[gpu]") {
  SoloBackend solo;
  auto& backend = solo.backend;
  CHECK(std::string(backend->name()) == "nccl");
  Deadline deadline = deadlineAfter(kTimeoutSeconds);
  for (CheckFn check : kChecks) report(check(*backend, deadline));
  backend->barrier(deadline);
}

// The stream contract (docs/nccl.md, "Streams and events"): the backend's stream is
// non-blocking, so only its event wait orders it after the input's producer, the legacy
// default stream. Without that wait the copy would read a pass still being written.
TEST_CASE("inputs written on the legacy default stream, not synchronized, are ordered", "[gpu]") {
  SoloBackend solo;
  const size_t bytes = size_t{64} << 20;
  test::DeviceBuffer in(bytes), out(bytes);
  for (int pass = 0; pass < 16; ++pass)  // the last pass writes 7s
    REQUIRE(cudaMemsetAsync(in.get(), pass % 2 ? 7 : 3, bytes, cudaStreamLegacy) == cudaSuccess);
  solo.backend->allreduce(in.get(), out.get(), static_cast<int64_t>(bytes), DataType::kUInt8,
                          ReduceOp::kSum, deadlineAfter(kTimeoutSeconds));
  const auto host = out.download(bytes);
  CHECK(static_cast<size_t>(std::count(host.begin(), host.end(), uint8_t{7})) == bytes);
}

// Scaled reductions (backend.h's ReduceScaling) in a group of one: the result is the input
// times prescale * postscale / divisor, computed on the device.
TEST_CASE("allreduce and reducescatter scale on the device", "[gpu]") {
  SoloBackend solo;
  Backend& backend = *solo.backend;
  auto scaling = [](double pre, double post, int64_t divisor) {
    ReduceScaling s;
    s.prescale = pre;
    s.postscale = post;
    s.divisor = divisor;
    return s;
  };
  const int64_t n = 1001;
  auto run = [&](DataType dtype, const ReduceScaling& s, bool scatter) {
    const int64_t esize = dataTypeSize(dtype);
    std::vector<uint8_t> host(static_cast<size_t>(n * esize));
    for (int64_t i = 0; i < n; ++i) storeElement(host.data(), i, dtype, static_cast<double>(i % 9));
    test::DeviceBuffer in(host.size()), out(host.size());
    in.upload(host);
    Deadline deadline = deadlineAfter(kTimeoutSeconds);
    if (scatter)
      backend.reducescatterScaled(in.get(), out.get(), {n}, dtype, ReduceOp::kSum, s, deadline);
    else
      backend.allreduceScaled(in.get(), out.get(), n, dtype, ReduceOp::kSum, s, deadline);
    auto result = out.download(host.size());
    const double factor = s.prescale * s.postscale / static_cast<double>(s.divisor);
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += loadElement(result.data(), i, dtype) != static_cast<double>(i % 9) * factor;
    return wrong;
  };
  for (bool scatter : {false, true}) {
    INFO((scatter ? "reducescatter" : "allreduce"));
    CHECK(run(DataType::kFloat32, scaling(0.5, 4.0, 1), scatter) == 0);
    CHECK(run(DataType::kFloat64, scaling(1.0, 1.0, 2), scatter) == 0);
    CHECK(run(DataType::kFloat16, scaling(0.25, 1.0, 1), scatter) == 0);
    CHECK(run(DataType::kBFloat16, scaling(2.0, 1.0, 4), scatter) == 0);
    CHECK(run(DataType::kInt32, scaling(3.0, -1.0, 1), scatter) == 0);
    CHECK(run(DataType::kInt64, scaling(1.0, 1.0, 1), scatter) == 0);
  }
  CHECK(backend.scalingRefusal(DataType::kInt32, ReduceOp::kSum, scaling(1.0, 1.0, 2)) ==
        "scale factors on int32 CUDA tensors must multiply to an integer, without an average");
  test::DeviceBuffer buffer(16);
  try {
    backend.allreduceScaled(buffer.get(), buffer.get(), 4, DataType::kFloat32, ReduceOp::kMax,
                            scaling(2.0, 1.0, 1), deadlineAfter(kTimeoutSeconds));
    FAIL("a scaled max was accepted");
  } catch (const Error& error) {
    CHECK(error.code() == StatusCode::kUnsupported);
    CHECK_THAT(error.what(), Catch::Contains("only sum and average can be scaled"));
  }
  // The refusal made no NCCL call: the communicator still works.
  CHECK(run(DataType::kFloat32, scaling(1.0, 1.0, 1), false) == 0);
}

// Runs `body(rank, backend)` on `size` thread-ranks, each with its own GPU and NCCL backend
// over one loopback world, and returns each rank's failures.
template <typename Body>
std::vector<test::Failures> onThreadRanks(int size, Body body) {
  auto hub = makeLoopbackHub(size);
  std::vector<test::Failures> failures(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank)
    threads.emplace_back([&, rank] {
      failures[rank] = test::runCheck([&] {
        LoopbackGroup group(hub, rank, size);
        BackendOptions options;
        options.timeout_seconds = kTimeoutSeconds;
        options.rank = options.local_rank = rank;
        options.size = size;
        auto backend = makeNcclBackend(*group.control, options);
        if (!backend) return test::Failures{"rank " + std::to_string(rank) + ": no backend"};
        if (cudaSetDevice(rank) != cudaSuccess)
          return test::Failures{"rank " + std::to_string(rank) + ": cudaSetDevice failed"};
        return body(rank, *backend);
      });
    });
  for (auto& thread : threads) thread.join();
  return failures;
}

TEST_CASE("threads as ranks, one GPU each: every op matches the reference", "[gpu]") {
  int devices = test::cudaDeviceCountOrZero();
  if (devices < 2) WARN("only " << devices << " CUDA device(s): multi-rank cases need 2+");
  for (int size = 2; size <= std::min(devices, 4); ++size) {
    auto failures = onThreadRanks(size, [](int, Backend& backend) {
      Deadline deadline = deadlineAfter(kTimeoutSeconds);
      test::Failures all;
      for (CheckFn check : kChecks) {
        auto found = check(backend, deadline);
        all.insert(all.end(), found.begin(), found.end());
      }
      return all;
    });
    for (int rank = 0; rank < size; ++rank) {
      INFO("world of " << size << ", rank " << rank);
      report(failures[rank]);
    }
  }
}

TEST_CASE("a rank that skips an op times its peer out; the error is sticky", "[gpu]") {
  if (test::cudaDeviceCountOrZero() < 2) return;
  std::promise<void> timed_out;
  auto done = timed_out.get_future().share();
  auto failures = onThreadRanks(2, [&](int rank, Backend& backend) {
    test::Failures found;
    backend.barrier(deadlineAfter(kTimeoutSeconds));
    if (rank == 1) {  // skips the allreduce, then aborts once rank 0 has timed out
      done.wait_for(std::chrono::seconds(60));
      backend.abort("test: rank 0 timed out");
      return found;
    }
    test::DeviceBuffer buf(1024);
    for (int i = 0; i < 2; ++i) {
      auto start = Clock::now();
      try {
        backend.allreduce(buf.get(), buf.get(), 256, DataType::kFloat32, ReduceOp::kSum,
                          deadlineAfter(3.0));
        found.push_back("allreduce without its peer returned");
      } catch (const Error& error) {
        std::string message = error.what();
        if (error.code() != StatusCode::kTimeout) found.push_back("not kTimeout: " + message);
        if (message.find("allreduce of 256 x float32") == std::string::npos)
          found.push_back("message does not name the op: " + message);
      }
      double waited = std::chrono::duration<double>(Clock::now() - start).count();
      if (waited > (i == 0 ? 30.0 : 1.0))
        found.push_back("call " + std::to_string(i) + " took " + std::to_string(waited) + " s");
    }
    timed_out.set_value();
    return found;
  });
  report(failures[0]);
  report(failures[1]);
}

TEST_CASE("abort() poisons the backend: every later op fails fast with kAborted", "[gpu]") {
  SoloBackend solo;
  auto& backend = solo.backend;
  backend->barrier(deadlineAfter(kTimeoutSeconds));
  backend->abort("test abort");
  for (int i = 0; i < 2; ++i) {
    try {
      backend->barrier(deadlineAfter(kTimeoutSeconds));
      FAIL("barrier after abort() should throw");
    } catch (const Error& error) {
      CHECK(error.code() == StatusCode::kAborted);
      CHECK(std::string(error.what()).find("test abort") != std::string::npos);
    }
  }
}

}  // namespace
}  // namespace tutti

int main(int argc, char** argv) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv)) return rc;
  if (tutti::test::cudaDeviceCountOrZero() > 0) return session.run();
  session.configData().testsOrTags = {"[no-gpu]"};
  int failed = session.run();
  if (failed) return failed;
  std::printf("skipped: no CUDA device; the [gpu] cases need one\n");
  return tutti::test::kSkipReturnCode;
}
