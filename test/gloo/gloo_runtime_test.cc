// The whole runtime on the gloo transport, through the public C++ API, under
// `tuttirun -np N`: init picks gloo from tuttirun's environment; fused allreduces (sum,
// average, min), broadcast, allgather of uneven rows, alltoall with splits, reducescatter,
// a process set of the odd ranks, barrier and shutdown. Exits non-zero on a wrong element.
#include <tutti/tutti.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "rank %d: FAILED %s\n", tutti::rank(), what.c_str());
}

void ok(const tutti::Status& s, const std::string& what) {
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s: %s\n", tutti::rank(), what.c_str(), s.message().c_str());
    std::exit(2);
  }
}

tutti::TensorView view(void* data, tutti::DataType dtype, std::vector<int64_t> shape) {
  tutti::TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

}  // namespace

int main() {
  using tutti::DataType;
  ok(tutti::init(), "init");
  const int r = tutti::rank(), n = tutti::size();
  check(tutti::cpuBackend() == "gloo", "cpu backend is gloo, got " + tutti::cpuBackend());

  // Fused allreduces: 8 small tensors in flight at once, then wait on all.
  for (auto op : {tutti::ReduceOp::kSum, tutti::ReduceOp::kAverage, tutti::ReduceOp::kMin}) {
    std::vector<std::vector<double>> data(8);
    std::vector<tutti::Handle> handles(8);
    for (int t = 0; t < 8; ++t) {
      data[t].assign(t * 13 + 1, 0.0);
      for (size_t i = 0; i < data[t].size(); ++i) data[t][i] = r + i + t;
      auto v = view(data[t].data(), DataType::kFloat64, {int64_t(data[t].size())});
      tutti::OpOptions o;
      o.op = op;
      ok(tutti::allreduceAsync("ar." + std::to_string(int(op)) + "." + std::to_string(t), v,
                               v, o, &handles[t]), "allreduce enqueue");
    }
    for (int t = 0; t < 8; ++t) {
      ok(tutti::wait(handles[t], -1), "allreduce wait");
      for (size_t i = 0; i < data[t].size(); ++i) {
        const double base = double(i + t);
        const double expect = op == tutti::ReduceOp::kSum ? n * base + n * (n - 1) / 2.0
                              : op == tutti::ReduceOp::kAverage ? base + (n - 1) / 2.0
                                                                : base;
        check(data[t][i] == expect, "allreduce op " + std::to_string(int(op)));
      }
    }
  }

  // Broadcast from the last rank.
  std::vector<int32_t> b(101, r);
  tutti::OpOptions bo;
  bo.root = n - 1;
  tutti::Handle h;
  ok(tutti::broadcastAsync("bcast", view(b.data(), DataType::kInt32, {101}), bo, &h), "bcast");
  ok(tutti::wait(h, -1), "bcast wait");
  for (int32_t x : b) check(x == n - 1, "broadcast");

  // Allgather: rank r contributes r + 1 rows of 3 floats (rank 0 of a world of one: 1 row).
  std::vector<float> in((r + 1) * 3, float(r));
  ok(tutti::allgatherAsync("gather", view(in.data(), DataType::kFloat32, {r + 1, 3}),
                           tutti::OpOptions(), &h), "allgather");
  tutti::Result res;
  ok(tutti::wait(h, -1, &res), "allgather wait");
  check(res.shape.size() == 2 && res.shape[0] == n * (n + 1) / 2 && res.shape[1] == 3,
        "allgather shape");
  const float* g = static_cast<const float*>(res.data);
  for (int q = 0, at = 0; q < n && g; ++q)
    for (int row = 0; row < (q + 1) * 3; ++row, ++at) check(g[at] == float(q), "allgather");
  std::free(res.data);

  // Alltoall: rank r sends j + 1 rows of one int64 (value 100 r + j) to rank j.
  std::vector<int64_t> splits(n), send;
  for (int j = 0; j < n; ++j) {
    splits[j] = j + 1;
    for (int k = 0; k <= j; ++k) send.push_back(100 * r + j);
  }
  tutti::OpOptions ao;
  ao.splits = splits;
  ok(tutti::alltoallAsync("a2a", view(send.data(), DataType::kInt64, {int64_t(send.size())}),
                          ao, &h), "alltoall");
  ok(tutti::wait(h, -1, &res), "alltoall wait");
  check(res.shape.size() == 1 && res.shape[0] == int64_t(n) * (r + 1), "alltoall shape");
  const int64_t* a = static_cast<const int64_t*>(res.data);
  for (int q = 0, at = 0; q < n && a; ++q)
    for (int k = 0; k <= r; ++k, ++at) check(a[at] == 100 * q + r, "alltoall");
  std::free(res.data);

  // Reducescatter of 2n + 1 rows: sum.
  std::vector<float> rs(2 * n + 1, 1.0f + r);
  ok(tutti::reducescatterAsync("rs", view(rs.data(), DataType::kFloat32, {2 * n + 1}),
                               tutti::OpOptions(), &h), "reducescatter");
  ok(tutti::wait(h, -1, &res), "reducescatter wait");
  const float* s = static_cast<const float*>(res.data);
  for (int64_t i = 0; s && i < res.shape[0]; ++i)
    check(s[i] == float(n * (n + 1) / 2), "reducescatter");
  std::free(res.data);

  // A process set of the odd ranks (or of rank 0 alone).
  std::vector<int> odd;
  for (int q = 1; q < n; q += 2) odd.push_back(q);
  if (odd.empty()) odd.push_back(0);
  int ps = 0;
  ok(tutti::addProcessSet(odd, &ps), "add process set");
  if (tutti::processSetRank(ps) >= 0) {
    std::vector<float> x(7, 1.0f);
    tutti::OpOptions po;
    po.process_set = ps;
    auto v = view(x.data(), DataType::kFloat32, {7});
    ok(tutti::allreduceAsync("ps.ar", v, v, po, &h), "process set allreduce");
    ok(tutti::wait(h, -1), "process set wait");
    for (float y : x) check(y == float(odd.size()), "process set allreduce");
  }
  ok(tutti::removeProcessSet(ps), "remove process set");

  ok(tutti::barrierAsync(TUTTI_GLOBAL_PROCESS_SET, &h), "barrier");
  ok(tutti::wait(h, -1), "barrier wait");
  ok(tutti::shutdown(), "shutdown");
  std::printf("rank %d: gloo runtime: %d failures\n", r, failures);
  return failures == 0 ? 0 : 1;
}
