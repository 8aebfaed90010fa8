// The only C++ file with #if TUTTI_WITH_*.
#include "backends/registry.h"

#include "backends/hierarchical/hier_backend.h"
#include "backends/hierarchical/two_level_control_plane.h"
#include "backends/loopback/loopback.h"
#include "backends/shm/shm_backend.h"
#include "backends/shm/shm_control_plane.h"
#if TUTTI_WITH_MPI
#include "backends/mpi/mpi_transport.h"
#endif
#if TUTTI_WITH_GLOO
#include "backends/gloo/gloo_transport.h"
#endif
#if TUTTI_WITH_NCCL
#include "backends/nccl/nccl_backend.h"
#endif

namespace tutti {

std::vector<std::string> builtBackends() {
  std::vector<std::string> names;
#if TUTTI_WITH_MPI
  names.push_back("mpi");
#endif
#if TUTTI_WITH_GLOO
  names.push_back("gloo");
#endif
#if TUTTI_WITH_NCCL
  names.push_back("nccl");
#endif
  names.push_back("loopback");
  return names;
}

bool backendBuiltByName(const std::string& name) {
  for (const auto& built : builtBackends())
    if (built == name) return true;
  return false;
}

namespace {

std::string defaultCpuOperations(const BackendOptions& options) {
  if (options.store) return options.size == 1 ? "loopback" : "gloo";
  if (!options.rendezvous_addr.empty()) return "gloo";
  if (options.launcher == "Open MPI") return "mpi";
  if (options.size == 1) return "loopback";
  // torchrun and hydra: rank 0 serves gloo's rendezvous (an Open MPI build cannot join them).
  if (!options.hosted.launcher.empty()) return "gloo";
  // Launched by Slurm or with only TUTTI_* topology: MPI if we have it, else gloo.
  return backendBuiltByName("mpi") ? "mpi" : "gloo";
}

// The transport's control planes, replaced where shared memory helps: shm ones for sets
// whose members all run on this host, two-level ones for sets across hosts with several
// members on some host (their host's part made by this transport, so over shm). Both
// choices are collective at set creation; everything else, the data-plane backends
// included, is inner's.
class HostControlPlanes : public Transport {
 public:
  HostControlPlanes(std::unique_ptr<Transport> inner, const BackendOptions& options)
      : inner_(std::move(inner)), options_(options) {}
  const char* name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  std::unique_ptr<ControlPlane> makeControlPlane(const std::vector<int>& ranks,
                                                 int id) override {
    auto set = inner_->makeControlPlane(ranks, id);
    if (auto shm = makeShmControlPlane(set, ranks, id, options_)) return shm;
    const detail::HostLayout layout =
        detail::exchangeLayout(*set, id, size(), ranks, options_.shm, true,
                               deadlineAfter(options_.start_timeout_seconds));
    return makeTwoLevelControlPlane(*this, *inner_, std::move(set), layout);
  }
  std::unique_ptr<Backend> makeBackend(const std::vector<int>& ranks, int id) override {
    return inner_->makeBackend(ranks, id);
  }

 private:
  std::unique_ptr<Transport> inner_;
  const BackendOptions options_;
};

}  // namespace

std::unique_ptr<Transport> withShmControlPlanes(std::unique_ptr<Transport> inner,
                                                const BackendOptions& options) {
  // Wrapped even with TUTTI_SHM=0: the setup is collective, so that rank takes part and
  // says no (making every member of its sets decline).
  return std::make_unique<HostControlPlanes>(std::move(inner), options);
}

std::unique_ptr<Transport> makeTransport(const BackendOptions& options) {
  std::string which = options.cpu_operations.empty() ? defaultCpuOperations(options)
                                                     : options.cpu_operations;
  if (which == "loopback") {
    if (options.size != 1)
      throwError(StatusCode::kInvalidArgument,
                 "TUTTI_CPU_OPERATIONS=loopback runs a world of one process, but this job has " +
                     std::to_string(options.size) + " ranks (from " + options.launcher + ")");
    return makeLoopbackTransport(makeLoopbackHub(1), 0);
  }
#if TUTTI_WITH_MPI
  if (which == "mpi") return withShmControlPlanes(makeMpiTransport(options), options);
#endif
#if TUTTI_WITH_GLOO
  if (which == "gloo") return withShmControlPlanes(makeGlooTransport(options), options);
#endif
  std::string built;
  for (const auto& name : builtBackends()) built += (built.empty() ? "" : ", ") + name;
  throwError(StatusCode::kUnsupported, "TUTTI_CPU_OPERATIONS=" + which +
                                           ": this build of Tutti has no such backend (built: " +
                                           built + ")");
}

std::vector<std::unique_ptr<Backend>> makeBackends(Transport& transport, ControlPlane& control,
                                                   const std::vector<int>& ranks, int id,
                                                   const BackendOptions& options) {
  std::vector<std::unique_ptr<Backend>> backends;
#if TUTTI_WITH_NCCL
  if (auto nccl = makeNcclBackend(control, options)) backends.push_back(std::move(nccl));
#endif
  // Sets whose members all run on this host: shared memory ahead of the transport. Sets
  // across hosts with as many members on each: hierarchical allreduce ahead of it.
  auto flat = transport.makeBackend(ranks, id);
  auto shm = makeShmBackend(control, ranks, id, options, transport.name(), *flat);
  if (shm)
    backends.push_back(std::move(shm));
  else if (auto hier = makeHierarchicalBackend(transport, control, *flat, ranks, id, options))
    backends.push_back(std::move(hier));
  backends.push_back(std::move(flat));
  return backends;
}

int backendSwitch(const std::vector<std::unique_ptr<Backend>>& backends, BackendSwitch which) {
  for (const auto& b : backends)
    if (int state = b->switchState(which); state >= 0) return state;
  return -1;
}

bool setBackendSwitch(const std::vector<std::unique_ptr<Backend>>& backends,
                      BackendSwitch which, bool on) {
  bool found = false;
  for (const auto& b : backends) found = b->setSwitch(which, on) || found;
  return found;
}

}  // namespace tutti
