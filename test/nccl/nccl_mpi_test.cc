// The NCCL backend across processes under mpirun (one GPU per rank). The communicator is
// bootstrapped through a ControlPlane on MPI_COMM_WORLD. Without a GPU on every rank the
// binary checks that the factory declines on every rank and exits with kSkipReturnCode.
#define CATCH_CONFIG_RUNNER
#include "test/catch.h"

#include "backends/nccl/nccl_backend.h"
#include "test/nccl/nccl_test_util.h"

#include <cuda_runtime_api.h>
#define OMPI_SKIP_MPICXX 1  // the C API is enough; its C++ bindings are not -Wextra clean
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace tutti {
namespace {

constexpr double kTimeoutSeconds = 120.0;

// Negotiation bytes over MPI_COMM_WORLD with non-blocking MPI calls polled to a deadline.
class MpiControlPlane : public ControlPlane {
 public:
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<std::string> gather(const std::string& bytes, Deadline deadline) override {
    int length = static_cast<int>(bytes.size());
    std::vector<int> lengths(size_);
    MPI_Request request;
    MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &request);
    wait(request, deadline, "gather lengths");
    std::vector<int> offsets(size_, 0);
    for (int r = 1; r < size_; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
    std::string all(rank_ == 0 ? offsets.back() + lengths.back() : 0, '\0');
    MPI_Igatherv(bytes.data(), length, MPI_CHAR, &all[0], lengths.data(), offsets.data(), MPI_CHAR,
                 0, MPI_COMM_WORLD, &request);
    wait(request, deadline, "gather bytes");
    std::vector<std::string> out;
    if (rank_ == 0)
      for (int r = 0; r < size_; ++r) out.push_back(all.substr(offsets[r], lengths[r]));
    return out;
  }

  std::string broadcast(const std::string& bytes, Deadline deadline) override {
    int length = static_cast<int>(bytes.size());
    MPI_Request request;
    MPI_Ibcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD, &request);
    wait(request, deadline, "broadcast length");
    std::string out = rank_ == 0 ? bytes : std::string(length, '\0');
    MPI_Ibcast(&out[0], length, MPI_CHAR, 0, MPI_COMM_WORLD, &request);
    wait(request, deadline, "broadcast bytes");
    return out;
  }

  void allreduceAnd(std::vector<uint64_t>& bits, Deadline deadline) override {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, bits.data(), static_cast<int>(bits.size()), MPI_UINT64_T, MPI_BAND,
                   MPI_COMM_WORLD, &request);
    wait(request, deadline, "allreduce-and");
  }

  void abort(const std::string& reason) override {
    std::fprintf(stderr, "rank %d: control plane abort: %s\n", rank_, reason.c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  void wait(MPI_Request& request, Deadline deadline, const char* what) {
    for (;;) {
      int done = 0;
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (Clock::now() >= deadline)
        abort(std::string(what) + ": deadline passed waiting for the other ranks");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  int rank_ = [] {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }();
  int size_ = [] {
    int s = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }();
};

MpiControlPlane* g_control = nullptr;
BackendOptions g_options;

int envInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

std::unique_ptr<Backend> makeBackend() {
  auto backend = makeNcclBackend(*g_control, g_options);
  REQUIRE(backend != nullptr);
  REQUIRE(backend->rank() == g_control->rank());
  REQUIRE(backend->size() == g_control->size());
  int devices = test::cudaDeviceCountOrZero();
  REQUIRE(cudaSetDevice(g_options.local_rank % devices) == cudaSuccess);
  return backend;
}

// Fails the current test case with every mismatch a check found.
void report(const test::Failures& failures) {
  for (const auto& failure : failures) FAIL_CHECK(failure);
  CHECK(failures.empty());
}

TEST_CASE("every op matches the host reference across ranks", "[gpu]") {
  auto backend = makeBackend();
  Deadline deadline = deadlineAfter(kTimeoutSeconds);
  report(test::checkAllreduce(*backend, deadline));
  report(test::checkAllgather(*backend, deadline));
  report(test::checkBroadcast(*backend, deadline));
  report(test::checkAlltoall(*backend, deadline));
  report(test::checkReducescatter(*backend, deadline));
  report(test::checkArgumentErrors(*backend, deadline));
}

TEST_CASE("a rank that skips an op times its peers out; the error is sticky", "[gpu]") {
  auto backend = makeBackend();
  backend->barrier(deadlineAfter(kTimeoutSeconds));
  if (backend->rank() == 0) {
    test::DeviceBuffer buf(1024);
    for (int i = 0; i < 2; ++i) {
      auto start = Clock::now();
      try {
        backend->allreduce(buf.get(), buf.get(), 256, DataType::kFloat32, ReduceOp::kSum,
                           deadlineAfter(3.0));
        FAIL("allreduce without its peers should time out");
      } catch (const Error& error) {
        INFO(error.what());
        CHECK(error.code() == StatusCode::kTimeout);
        CHECK(std::string(error.what()).find("allreduce of 256 x float32") != std::string::npos);
      }
      double waited = std::chrono::duration<double>(Clock::now() - start).count();
      CHECK(waited < (i == 0 ? 30.0 : 1.0));  // the second call fails fast
    }
  }
  backend->abort("test: rank 0 timed out");
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace tutti

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  tutti::MpiControlPlane control;
  tutti::g_control = &control;
  tutti::g_options.timeout_seconds = tutti::kTimeoutSeconds;
  tutti::g_options.rank = control.rank();
  tutti::g_options.size = control.size();
  tutti::g_options.local_rank = tutti::envInt("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  const int local_size = tutti::envInt("OMPI_COMM_WORLD_LOCAL_SIZE", 1);

  // NCCL needs one GPU per rank: run the [gpu] cases only if every rank has its own.
  int devices = tutti::test::cudaDeviceCountOrZero();
  int own_gpu = devices >= local_size ? 1 : 0;
  int fewest_devices = devices;
  MPI_Allreduce(MPI_IN_PLACE, &own_gpu, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &fewest_devices, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

  int rc;
  if (own_gpu) {
    Catch::Session session;
    rc = session.applyCommandLine(argc, argv);
    if (rc == 0) rc = session.run();
  } else if (fewest_devices == 0) {
    // Some rank has no GPU: the factory must decline on every rank, together.
    bool declined = tutti::makeNcclBackend(control, tutti::g_options) == nullptr;
    if (!declined)
      std::fprintf(stderr, "rank %d: makeNcclBackend did not decline\n", control.rank());
    std::printf("rank %d: skipped: no CUDA device on some rank (%d here)\n", control.rank(),
                devices);
    rc = declined ? tutti::test::kSkipReturnCode : 1;
  } else {
    std::printf("rank %d: skipped: %d ranks share %d CUDA devices on this node\n", control.rank(),
                local_size, devices);
    rc = tutti::test::kSkipReturnCode;
  }
  MPI_Finalize();
  return rc;
}
