// A grouped allreduce whose group size differs between ranks, across real processes: every
// rank's handle fails at once with a mismatch naming the tensor, both sizes and the ranks
// (none waits for the tensors only the larger group holds), and the job goes on.
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <string>
#include <vector>

using namespace tutti;
using namespace tutti::itest;

namespace {

HostTensor expectedSum(uint64_t seed) {
  HostTensor x(DataType::kFloat32, {8});
  std::vector<double> all(static_cast<size_t>(size()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    for (int r = 0; r < size(); ++r)
      all[static_cast<size_t>(r)] = inputValue(DataType::kFloat32, ReduceOp::kSum, r, seed, i);
    x.set(i, referenceReduce(DataType::kFloat32, ReduceOp::kSum, all, 1, 1, size()));
  }
  return x;
}

// A group of `n` float tensors "gs.<step>.<k>" of 8 elements, submitted; its handle.
Handle submitGroup(int n, int step, std::vector<HostTensor>& tensors) {
  tensors.clear();
  std::vector<std::string> names;
  std::vector<TensorView> views;
  for (int k = 0; k < n; ++k) {
    tensors.emplace_back(DataType::kFloat32, std::vector<int64_t>{8});
    fillInput(tensors.back(), ReduceOp::kSum, rank(), 500 + k);
    names.push_back("gs." + std::to_string(step) + "." + std::to_string(k));
  }
  for (auto& t : tensors) views.push_back(t.view());
  Handle h = 0;
  REQUIRE(groupedAllreduceAsync(names, views, views, OpOptions(), &h).ok());
  return h;
}

}  // namespace

TEST_CASE("a group of another size on one rank fails on every rank, and the job goes on",
          "[grouped]") {
  requireInit();
  if (size() < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  const int odd = size() - 1;  // holds 3 tensors where the others hold 2
  for (int step = 0; step < 2; ++step) {  // twice: the same names fail the same way again
    std::vector<HostTensor> tensors;
    Handle h = submitGroup(rank() == odd ? 3 : 2, step, tensors);
    // Well before the job's deadline: a group that waits for a tensor that never comes
    // would only fail at TUTTI_TIMEOUT_SECONDS, naming another tensor.
    Status s = wait(h, 20.0);
    INFO("rank " << rank() << ", step " << step << ": " << describe(s));
    CHECK(s.code() == StatusCode::kMismatch);
    CHECK(s.message().find("group size 2 on rank 0 but 3 on rank " + std::to_string(odd)) !=
          std::string::npos);
    CHECK(s.message().find("'gs." + std::to_string(step) + ".") != std::string::npos);
  }
  // Grouped alike, the same names run.
  std::vector<HostTensor> tensors;
  Handle h = submitGroup(3, 0, tensors);
  CHECK(describe(waitFor(h)) == "kOk");
  for (int k = 0; k < 3; ++k)
    CHECK(compare(expectedSum(500 + k), tensors[k].data(), 8, "gs again") == "");
}
