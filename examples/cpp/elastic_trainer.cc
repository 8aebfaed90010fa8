// Elastic data-parallel training by hand with Tutti's C++ API (docs/elastic.md): what
// tutti.torch.elastic.run does for Python. A linear model y = w.x learns a fixed target; the
// state (weights and step) is committed every few steps. When a collective fails with a
// recoverable status (a worker died), the trainer restores the last commit, shuts down, inits
// again (joining the launcher's next world) and takes rank 0's state; when the launcher has
// new hosts (hostsUpdated at a commit, agreed by allreduce), it does the same without the
// restore.
//
//   tuttirun -np 4 --min-np 2 ./elastic_trainer --steps 200
//   ./elastic_trainer --die-at 50   (the rank 1 of the first world exits at step 50, as a crash)
//   ./elastic_trainer --step-ms 20  (each step takes at least 20 ms, as a real one would)
//   ./elastic_trainer --fail-at-end 3 --linger-ms 2000  (the rank 1 of the first world exits
//       with 3 once training is done, as a crash in its clean-up; every other rank waits
//       2 s before it exits, as writing a checkpoint would)
//
// Exit status: 0 when training finished and the replicas agree, 1 otherwise.
#include <tutti/tutti.hpp>

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kDim = 4;

struct State {
  std::vector<double> w = std::vector<double>(kDim, 0.0);
  double step = 0;  // a double, so that the whole state travels in one broadcast
  std::vector<double> pack() const {
    std::vector<double> v(w);
    v.push_back(step);
    return v;
  }
  void unpack(const std::vector<double>& v) {
    w.assign(v.begin(), v.begin() + kDim);
    step = v[kDim];
  }
};

tutti::TensorView view(std::vector<double>& v) {
  tutti::TensorView t;
  t.data = v.data();
  t.dtype = tutti::DataType::kFloat64;
  t.shape = {static_cast<int64_t>(v.size())};
  return t;
}

// Runs one collective to completion; the status says whether it failed and how.
tutti::Status allreduce(const std::string& name, std::vector<double>& v, tutti::ReduceOp op) {
  tutti::OpOptions options;
  options.op = op;
  tutti::Handle h = 0;
  tutti::Status s = tutti::allreduceAsync(name, view(v), view(v), options, &h);
  return s.ok() ? tutti::wait(h, -1.0) : s;
}

tutti::Status sync(State& state) {  // rank 0's state to everyone
  std::vector<double> v = state.pack();
  tutti::OpOptions options;
  options.root = 0;
  tutti::Handle h = 0;
  tutti::Status s = tutti::broadcastAsync("elastic.state", view(v), options, &h);
  if (s.ok()) s = tutti::wait(h, -1.0);
  if (s.ok()) state.unpack(v);
  return s;
}

// One step of SGD on this rank's sample of the target w* = (1, 2, 3, 4).
tutti::Status trainStep(State& state, double lr) {
  std::vector<double> grad(kDim);
  const double x0 = 1.0 + tutti::rank() + state.step;  // this rank's input, this step
  double pred = 0, target = 0;
  std::vector<double> x(kDim);
  for (int i = 0; i < kDim; ++i) {
    x[i] = std::sin(x0 * (i + 1));
    pred += state.w[i] * x[i];
    target += (i + 1) * x[i];
  }
  for (int i = 0; i < kDim; ++i) grad[i] = 2 * (pred - target) * x[i];
  tutti::Status s = allreduce("elastic.grad", grad, tutti::ReduceOp::kAverage);
  if (!s.ok()) return s;
  for (int i = 0; i < kDim; ++i) state.w[i] -= lr * grad[i];
  state.step += 1;
  return s;
}

// Whether any rank heard of new hosts: every rank must reset together.
tutti::Status hostsUpdatedAnywhere(bool* updated) {
  bool mine = false;
  tutti::Status s = tutti::hostsUpdated(&mine);
  if (!s.ok()) return s;
  std::vector<double> flag{mine ? 1.0 : 0.0};
  s = allreduce("elastic.hosts_updated", flag, tutti::ReduceOp::kMax);
  *updated = s.ok() && flag[0] > 0;
  return s;
}

void fail(const tutti::Status& s, const char* what) {
  std::fprintf(stderr, "elastic_trainer: %s: %s\n", what, s.message().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, commit_every = 10, die_at = -1, step_ms = 0, fail_at_end = 0, linger_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--die-at")) die_at = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--step-ms")) step_ms = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--fail-at-end")) fail_at_end = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--linger-ms")) linger_ms = std::atoi(argv[i + 1]);
  }
  tutti::Status s = tutti::init();
  if (!s.ok()) fail(s, "init");
  State state, committed;
  for (int resets = 0; resets < 1000; ++resets) {  // bounded: the launcher limits resets too
    s = sync(state);
    while (s.ok() && state.step < steps) {
      if (state.step == die_at && tutti::rank() == 1 && tutti::elasticGeneration() == 0)
        ::raise(SIGKILL);  // a crash: no shutdown, no exit hook
      if (step_ms > 0) ::usleep(static_cast<useconds_t>(step_ms) * 1000);
      s = trainStep(state, 0.05);
      if (s.ok() && static_cast<int>(state.step) % commit_every == 0) {
        committed = state;  // commit
        bool updated = false;
        s = hostsUpdatedAnywhere(&updated);
        if (s.ok() && updated) break;  // new hosts: reset without restoring
      }
    }
    if (s.ok() && state.step >= steps) break;
    if (!s.ok()) {
      if (!tutti::isRecoverable(s)) fail(s, "training");
      state = committed;  // restore
    }
    std::fprintf(stderr, "elastic_trainer: reset at step %g (%s)\n", state.step,
                 s.ok() ? "hosts updated" : s.message().c_str());
    tutti::shutdown();
    for (int tries = 0; tries < 100; ++tries) {  // init may fail while the world changes
      s = tutti::init();
      if (s.ok() || !tutti::isRecoverable(s)) break;
    }
    if (!s.ok()) fail(s, "init after a reset");
  }
  // Every replica must hold the same weights: compare with rank 0's.
  std::vector<double> mine = state.pack(), root = mine;
  tutti::OpOptions options;
  tutti::Handle h = 0;
  s = tutti::broadcastAsync("elastic.check", view(root), options, &h);
  if (s.ok()) s = tutti::wait(h, -1.0);
  if (!s.ok()) fail(s, "final check");
  double error = 0;
  for (int i = 0; i < kDim; ++i) error += std::fabs(state.w[i] - (i + 1));
  std::printf("rank %d of %d (generation %lld): step %g, |w - w*| = %.3g, replicas %s\n",
              tutti::rank(), tutti::size(), static_cast<long long>(tutti::elasticGeneration()),
              state.step, error, mine == root ? "agree" : "DIFFER");
  const bool fails_at_end = fail_at_end != 0 && tutti::rank() == 1 &&
                            tutti::elasticGeneration() == 0;
  tutti::shutdown();
  if (fails_at_end) return fail_at_end;
  if (linger_ms > 0) ::usleep(static_cast<useconds_t>(linger_ms) * 1000);
  return mine == root ? 0 : 1;
}
