// The runtime behind the C API (core/api.h): holds the one Runtime and turns calls into
// queue entries.
#include "core/api.h"

#include "backends/registry.h"
#include "core/runtime.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace tutti {
namespace api {
namespace {

std::mutex g_mu;
// The one Runtime. Shared ownership only so that a call in flight keeps it alive while
// another thread shuts it down.
std::shared_ptr<Runtime> g_runtime;
// A Runtime that a callback shut down (on its own background thread, which cannot join
// itself): joined by the next init, shutdown or the exit hook.
std::shared_ptr<Runtime> g_retiring;
// Whether the last Runtime's job failed under it (another rank left, a fatal error).
std::atomic<bool> g_job_failed{false};
pid_t g_init_pid = 0;

// Stops `rt` unless we are its own background thread (then parks it in g_retiring).
void retire(std::shared_ptr<Runtime> rt, const std::string& note) {
  if (!rt) return;
  if (rt->onBackgroundThread()) {
    rt->shutdown(note);
    std::lock_guard<std::mutex> lock(g_mu);
    g_retiring = std::move(rt);
    return;
  }
  rt->shutdown(note);
  g_job_failed = rt->jobFailed();
}

void reapRetiring() {
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_retiring && g_retiring->onBackgroundThread()) return;
    rt = std::move(g_retiring);
  }
  retire(std::move(rt), "called shutdown");
}

// Process exit without tutti_shutdown (return from main, exit(n), an uncaught Python
// exception once the interpreter is done): stop the runtime, telling the peers this rank
// left and with which code, before anything registered earlier runs, in particular the
// MPI_Finalize hook of the MPI transport (it must not find the background thread in MPI).
// Not in a forked child, which has no background thread.
void shutdownAtExit(int status, void*) {
  if (getpid() != g_init_pid) return;
  reapRetiring();
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    rt = std::move(g_runtime);
  }
  retire(std::move(rt), "left the job (exited with code " + std::to_string(status) + ")");
}

// Runs last (registered before the transport's hooks). A rank that fails because the job
// failed under it (another rank left or was killed, a timeout) lets the cause's exit reach
// the launcher first, so that the launcher, which reports the first failure, reports it.
void settleAtExit(int status, void*) {
  if (getpid() != g_init_pid || status == 0 || !g_job_failed) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
}

std::shared_ptr<Runtime> current() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_runtime;
}

Status notInitialized() {
  return Status(StatusCode::kNotInitialized, "Tutti is not initialized: call tutti_init() first");
}

template <typename F>
Status guarded(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    return e.status();
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, e.what());
  }
}

// Every field of `e` from the call, assigned into the storage it has (no allocation when it
// held as long a name and shape before).
void fillEntry(TensorEntry& e, const std::string& name, OpType op, const TensorView& input,
               void* output, const OpOptions& options) {
  Request& q = e.request;
  q.rank = 0;
  q.op = op;
  q.name = name;
  q.dtype = input.dtype;
  q.reduce_op = options.op;
  q.device = input.device.type;
  q.root = options.root;
  q.prescale = options.prescale;
  q.postscale = options.postscale;
  q.shape = input.shape;
  q.splits = options.splits;
  q.group.clear();
  q.group_size = 0;
  q.ordered = options.ordered;
  e.input = input.data;
  e.output = output;
  e.allocator = options.allocator;
  e.handle.reset();
}

TensorEntry makeEntry(const std::string& name, OpType op, const TensorView& input, void* output,
                      const OpOptions& options) {
  TensorEntry e;
  fillEntry(e, name, op, input, output, options);
  return e;
}

// The `count` entries at `entries` under one handle (the queue copies their requests).
Status submit(const OpOptions& options, TensorEntry* entries, size_t count, Handle* handle) {
  auto rt = current();
  if (!rt) return notInitialized();
  if (handle == nullptr) return Status(StatusCode::kInvalidArgument, "handle pointer is null");
  return guarded(
      [&] { return rt->submit(options.process_set, entries, count, options.callback, handle); });
}

// One tensor, without a list: a training step submits each gradient this way. The entry is
// this thread's, reused (its name and shape keep their storage), unless a call is already
// using it on this thread (a callback run by a failing submit that submits again).
Status submitOne(const std::string& name, OpType op, const TensorView& input, void* output,
                 const OpOptions& options, Handle* handle) {
  struct One {
    TensorEntry entry;
    bool busy = false;
  };
  thread_local One t_one;  // one thread-local (one TLS look-up per call)
  One& one = t_one;
  if (one.busy) {
    TensorEntry e = makeEntry(name, op, input, output, options);
    return submit(options, &e, 1, handle);
  }
  struct Busy {  // the entry lets go of the caller's allocator and handle however it ends
    One& one;
    ~Busy() {
      one.entry.allocator = nullptr;
      one.entry.handle.reset();
      one.busy = false;
    }
  } busy{one};
  one.busy = true;
  fillEntry(one.entry, name, op, input, output, options);
  return submit(options, &one.entry, 1, handle);
}

Status checkSameLayout(const std::string& name, const TensorView& in, const TensorView& out) {
  if (in.dtype != out.dtype || in.shape != out.shape)
    return Status(StatusCode::kInvalidArgument,
                  "allreduce " + quotedName(name) + ": output is " + dataTypeName(out.dtype) + " " +
                      shapeString(out.shape) + " but input is " + dataTypeName(in.dtype) + " " +
                      shapeString(in.shape) + "; they must match");
  return Status::OK();
}

}  // namespace

namespace {

// The one way a Runtime is started: from `make_config` (the environment's settings, and the
// topology of the launcher or of the caller).
template <typename MakeConfig>
Status start(MakeConfig&& make_config) {
  reapRetiring();
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_runtime) return Status::OK();
  static std::once_flag settle_once, exit_once;
  std::call_once(settle_once, [] { on_exit(settleAtExit, nullptr); });
  return guarded([&] {
    g_runtime = std::make_shared<Runtime>(make_config());
    g_job_failed = false;
    g_init_pid = getpid();
    // After the transport's own exit hooks (MPI_Finalize), so that it runs before them.
    std::call_once(exit_once, [] { on_exit(shutdownAtExit, nullptr); });
    return Status::OK();
  });
}

}  // namespace

Status init() { return start([] { return parseConfig(); }); }

Status initWithStore(int rank, int size, std::shared_ptr<KeyValueStore> store) {
  return start([&] {
    Config config = parseConfig();
    if (config.cpu_operations == "mpi")
      throwError(StatusCode::kInvalidArgument,
                 "tutti_init_with_store: TUTTI_CPU_OPERATIONS=mpi, but MPI connects through "
                 "its own launcher, not through " + store->describe() +
                 "; unset it (gloo is used) or call tutti_init() under mpirun");
    // The caller's rank and size; what a launcher says is not read (local and cross rank
    // are measured at init, as always).
    config.topology = Topology();
    config.topology.rank = rank;
    config.topology.size = size;
    config.topology.source = "caller's store";
    config.slurm = SlurmStep();
    config.hosted = HostedRendezvous();
    config.elastic = ElasticWorker();
    config.store = std::move(store);
    return config;
  });
}

Status shutdown() {
  reapRetiring();
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    rt = std::move(g_runtime);
  }
  retire(std::move(rt), "called shutdown");
  return Status::OK();
}

bool isInitialized() { return current() != nullptr; }

#define TUTTI_TOPOLOGY_GETTER(fn, field) \
  int fn() {                             \
    auto rt = current();                 \
    return rt ? rt->topology().field : -1; \
  }
TUTTI_TOPOLOGY_GETTER(rank, rank)
TUTTI_TOPOLOGY_GETTER(size, size)
TUTTI_TOPOLOGY_GETTER(localRank, local_rank)
TUTTI_TOPOLOGY_GETTER(localSize, local_size)
TUTTI_TOPOLOGY_GETTER(crossRank, cross_rank)
TUTTI_TOPOLOGY_GETTER(crossSize, cross_size)
#undef TUTTI_TOPOLOGY_GETTER

Status allreduceAsync(const std::string& name, const TensorView& input, const TensorView& output,
                      const OpOptions& options, Handle* handle) {
  Status layout = checkSameLayout(name, input, output);
  if (!layout.ok()) return layout;
  return submitOne(name, OpType::kAllreduce, input, output.data, options, handle);
}

Status groupedAllreduceAsync(const std::vector<std::string>& names,
                             const std::vector<TensorView>& inputs,
                             const std::vector<TensorView>& outputs, const OpOptions& options,
                             Handle* handle) {
  if (names.size() != inputs.size() || names.size() != outputs.size() || names.empty())
    return Status(StatusCode::kInvalidArgument,
                  "grouped_allreduce: got " + std::to_string(names.size()) + " names, " +
                      std::to_string(inputs.size()) + " inputs and " +
                      std::to_string(outputs.size()) + " outputs; expected the same non-zero count");
  std::vector<TensorEntry> entries;
  for (size_t i = 0; i < names.size(); ++i) {
    Status layout = checkSameLayout(names[i], inputs[i], outputs[i]);
    if (!layout.ok()) return layout;
    if (names[i].empty())
      return Status(StatusCode::kInvalidArgument, "grouped_allreduce: tensor " + std::to_string(i) + " has no name");
    entries.push_back(makeEntry(names[i], OpType::kAllreduce, inputs[i], outputs[i].data, options));
  }
  return submit(options, entries.data(), entries.size(), handle);
}

Status broadcastAsync(const std::string& name, const TensorView& buffer, const OpOptions& options,
                      Handle* handle) {
  return submitOne(name, OpType::kBroadcast, buffer, buffer.data, options, handle);
}

#define TUTTI_OUTPUT_OP(fn, op_type)                                                         \
  Status fn(const std::string& name, const TensorView& input, const OpOptions& options,     \
            Handle* handle) {                                                                \
    return submitOne(name, op_type, input, nullptr, options, handle);                        \
  }
TUTTI_OUTPUT_OP(allgatherAsync, OpType::kAllgather)
TUTTI_OUTPUT_OP(alltoallAsync, OpType::kAlltoall)
TUTTI_OUTPUT_OP(reducescatterAsync, OpType::kReducescatter)
#undef TUTTI_OUTPUT_OP

namespace {
Status controlOp(OpType op, int process_set, Handle* handle) {
  OpOptions options;
  options.process_set = process_set;
  TensorView none;
  none.dtype = DataType::kUInt8;
  return submitOne("", op, none, nullptr, options, handle);
}
}  // namespace

Status barrierAsync(int process_set, Handle* handle) { return controlOp(OpType::kBarrier, process_set, handle); }
Status joinAsync(int process_set, Handle* handle) { return controlOp(OpType::kJoin, process_set, handle); }

Status poll(Handle handle, bool* done) {
  auto rt = current();
  if (!rt) return notInitialized();
  if (done == nullptr) return Status(StatusCode::kInvalidArgument, "poll: done pointer is null");
  return rt->poll(handle, done);
}

Status wait(Handle handle, double timeout_seconds, Result* result, bool* from_allocator) {
  auto rt = current();
  if (!rt) return notInitialized();
  return rt->wait(handle, timeout_seconds, result, from_allocator);
}

Status addProcessSet(const std::vector<int>& ranks, int* process_set) {
  auto rt = current();
  if (!rt) return notInitialized();
  if (process_set == nullptr) return Status(StatusCode::kInvalidArgument, "add_process_set: id pointer is null");
  return guarded([&] { return rt->addProcessSet(ranks, process_set); });
}

Status removeProcessSet(int process_set) {
  auto rt = current();
  if (!rt) return notInitialized();
  return guarded([&] { return rt->removeProcessSet(process_set); });
}

int processSetRank(int process_set) {
  auto rt = current();
  return rt ? rt->processSetRank(process_set) : -1;
}

int processSetSize(int process_set) {
  auto rt = current();
  if (!rt) return -1;
  auto ranks = rt->processSetRanks(process_set);
  return ranks.empty() ? -1 : static_cast<int>(ranks.size());
}

std::vector<int> processSetRanks(int process_set) {
  auto rt = current();
  return rt ? rt->processSetRanks(process_set) : std::vector<int>();
}

Status startTimeline(const std::string& path, bool mark_cycles) {
  auto rt = current();
  if (!rt) return notInitialized();
  if (path.empty()) return Status(StatusCode::kInvalidArgument, "start_timeline: the path is empty");
  return guarded([&] { return rt->startTimeline(path, mark_cycles); });
}

Status stopTimeline() {
  auto rt = current();
  if (!rt) return notInitialized();
  rt->stopTimeline();
  return Status::OK();
}

std::vector<std::pair<std::string, int64_t>> stats() {
  auto rt = current();
  return rt ? rt->stats() : std::vector<std::pair<std::string, int64_t>>();
}

bool backendBuilt(const std::string& name) { return backendBuiltByName(name); }

std::string cpuBackend() {
  auto rt = current();
  return rt ? rt->transportName() : "";
}

}  // namespace api
}  // namespace tutti
