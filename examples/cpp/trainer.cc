// Data-parallel SGD with Tutti: a tiny MLP (8 -> 16 -> 1, tanh) learns a synthetic regression
// target. Every rank owns its own shard of the data; rank 0's initial weights are broadcast
// to everyone; each step the four gradient tensors are averaged with named asynchronous
// allreduces (submitted together, so the runtime fuses them). At the end every rank checks
// that it holds exactly the same weights as every other rank.
//
//   mpirun -np 4 ./trainer            (or: tuttirun -np 4 ./trainer, or just ./trainer)
//   ./trainer --steps 300 --lr 0.1
//
// Exit status: 0 when training converged and the replicas agree, 1 otherwise.
#include <tutti/tutti.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kIn = 8, kHidden = 16, kSamplesPerRank = 256;

void check(const tutti::Status& s, const std::string& what) {
  if (s.ok()) return;
  std::fprintf(stderr, "[rank %d] %s failed: %s\n", tutti::rank(), what.c_str(),
               s.message().c_str());
  tutti::shutdown();
  std::exit(1);
}

tutti::TensorView view(std::vector<float>& v) {
  tutti::TensorView t;
  t.data = v.data();
  t.dtype = tutti::DataType::kFloat32;
  t.shape = {static_cast<int64_t>(v.size())};
  return t;
}

// The model's parameters, by name. The same names on every rank identify the same tensors.
struct Model {
  std::vector<float> w1 = std::vector<float>(kIn * kHidden), b1 = std::vector<float>(kHidden),
                     w2 = std::vector<float>(kHidden), b2 = std::vector<float>(1);
  std::vector<std::pair<std::string, std::vector<float>*>> params() {
    return {{"w1", &w1}, {"b1", &b1}, {"w2", &w2}, {"b2", &b2}};
  }
};

// The target every rank samples from: a fixed linear part plus a nonlinearity.
float target(const float* x) {
  float y = 0.5f * std::tanh(2.0f * x[0] * x[1]);
  for (int j = 0; j < kIn; ++j) y += 0.1f * static_cast<float>(j % 3 - 1) * x[j];
  return y;
}

// Forward and backward on the whole local shard; returns the mean squared error and fills
// `grads` (same layout as the model) with its gradient.
float lossAndGrad(Model& m, const std::vector<float>& xs, const std::vector<float>& ys,
                  Model& grads) {
  for (auto& p : grads.params()) std::fill(p.second->begin(), p.second->end(), 0.0f);
  const int n = static_cast<int>(ys.size());
  float loss = 0;
  float h[kHidden];
  for (int s = 0; s < n; ++s) {
    const float* x = &xs[static_cast<size_t>(s) * kIn];
    float out = m.b2[0];
    for (int k = 0; k < kHidden; ++k) {
      float a = m.b1[k];
      for (int j = 0; j < kIn; ++j) a += x[j] * m.w1[j * kHidden + k];
      h[k] = std::tanh(a);
      out += h[k] * m.w2[k];
    }
    const float err = out - ys[s];
    loss += err * err / n;
    const float dout = 2 * err / n;
    grads.b2[0] += dout;
    for (int k = 0; k < kHidden; ++k) {
      grads.w2[k] += dout * h[k];
      const float da = dout * m.w2[k] * (1 - h[k] * h[k]);
      grads.b1[k] += da;
      for (int j = 0; j < kIn; ++j) grads.w1[j * kHidden + k] += da * x[j];
    }
  }
  return loss;
}

// Average of `value` over all ranks (blocking).
float globalMean(float value, const std::string& name) {
  std::vector<float> v = {value};
  tutti::OpOptions avg;
  avg.op = tutti::ReduceOp::kAverage;
  tutti::Handle h = 0;
  check(tutti::allreduceAsync(name, view(v), view(v), avg, &h), "allreduce " + name);
  check(tutti::wait(h, -1), "wait " + name);
  return v[0];
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 300;
  float lr = 0.1f;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--lr")) lr = static_cast<float>(std::atof(argv[i + 1]));
  }
  check(tutti::init(), "tutti::init");
  const int rank = tutti::rank(), size = tutti::size();

  // 1. This rank's shard of the data.
  std::mt19937 data_rng(1000 + rank);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> xs(static_cast<size_t>(kSamplesPerRank) * kIn), ys(kSamplesPerRank);
  for (float& x : xs) x = uniform(data_rng);
  for (int s = 0; s < kSamplesPerRank; ++s) ys[s] = target(&xs[static_cast<size_t>(s) * kIn]);

  // 2. Random weights, different on every rank ... then everyone takes rank 0's.
  Model model, grads;
  std::mt19937 init_rng(7 + rank);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (auto& p : model.params())
    for (float& w : *p.second) w = normal(init_rng);
  std::vector<tutti::Handle> handles;
  for (auto& p : model.params()) {
    tutti::Handle h = 0;
    check(tutti::broadcastAsync("init/" + p.first, view(*p.second), tutti::OpOptions(), &h),
          "broadcast init/" + p.first);
    handles.push_back(h);
  }
  for (tutti::Handle h : handles) check(tutti::wait(h, -1), "wait for the initial weights");

  // 3. Train: local gradients, averaged across ranks, the same update everywhere.
  tutti::OpOptions average;
  average.op = tutti::ReduceOp::kAverage;
  float first_loss = 0, loss = 0;
  for (int step = 0; step < steps; ++step) {
    float local = lossAndGrad(model, xs, ys, grads);
    handles.clear();
    for (auto& g : grads.params()) {  // all four in flight at once: one fused allreduce
      tutti::Handle h = 0;
      check(tutti::allreduceAsync("grad/" + g.first, view(*g.second), view(*g.second), average,
                                  &h),
            "allreduce grad/" + g.first);
      handles.push_back(h);
    }
    for (tutti::Handle h : handles) check(tutti::wait(h, -1), "wait for the gradients");
    auto params = model.params(), gparams = grads.params();
    for (size_t p = 0; p < params.size(); ++p)
      for (size_t i = 0; i < params[p].second->size(); ++i)
        (*params[p].second)[i] -= lr * (*gparams[p].second)[i];
    if (step == 0 || step % 50 == 49 || step == steps - 1) {
      loss = globalMean(local, "loss");
      if (step == 0) first_loss = loss;
      if (rank == 0) std::printf("step %4d  loss %.6f\n", step, loss);
    }
  }

  // 4. Every replica must hold identical weights: elementwise min == max across ranks.
  std::vector<float> flat;
  for (auto& p : model.params()) flat.insert(flat.end(), p.second->begin(), p.second->end());
  std::vector<float> lo = flat, hi = flat;
  tutti::OpOptions mn, mx;
  mn.op = tutti::ReduceOp::kMin;
  mx.op = tutti::ReduceOp::kMax;
  tutti::Handle hlo = 0, hhi = 0;
  check(tutti::allreduceAsync("check/min", view(lo), view(lo), mn, &hlo), "allreduce check/min");
  check(tutti::allreduceAsync("check/max", view(hi), view(hi), mx, &hhi), "allreduce check/max");
  check(tutti::wait(hlo, -1), "wait check/min");
  check(tutti::wait(hhi, -1), "wait check/max");
  int differing = 0;
  for (size_t i = 0; i < flat.size(); ++i)
    if (std::memcmp(&lo[i], &hi[i], sizeof(float)) != 0) ++differing;

  const bool converged = loss < 0.5f * first_loss;
  if (rank == 0) {
    std::printf("ranks %d  final loss %.6f (first %.6f)  weights identical on all ranks: %s\n",
                size, loss, first_loss, differing == 0 ? "yes" : "NO");
  }
  if (differing != 0)
    std::fprintf(stderr, "[rank %d] %d of %zu weights differ across ranks\n", rank, differing,
                 flat.size());
  if (!converged && rank == 0)
    std::fprintf(stderr, "loss did not halve: first %.6f, final %.6f\n", first_loss, loss);
  check(tutti::shutdown(), "tutti::shutdown");
  return differing == 0 && converged ? 0 : 1;
}
