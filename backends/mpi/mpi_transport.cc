// Open MPI transport: initializes MPI (MPI_THREAD_MULTIPLE) unless the program did, and
// makes one communicator per control plane and one per backend, so that negotiation and
// data never share a communicator. Group creation is collective over the members only.
#include "backends/mpi/mpi_transport.h"

#include "backends/mpi/mpi_backend.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

namespace tutti {
namespace {

using detail::MpiGroupInfo;
using detail::MpiPoison;
using detail::MpiShared;

const char* threadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

// Open MPI started by srun learns its peers only through the PMIx (or PMI-2) server of
// Slurm's MPI plugin; with none it cannot wire up, so say what to do before MPI_Init.
void checkSlurmPmi(const BackendOptions& options) {
  if (options.launcher != "Slurm" || options.slurm.pmi) return;
  throwError(StatusCode::kInvalidArgument,
             "mpi transport: rank " + std::to_string(options.rank) + " of " +
                 std::to_string(options.size) + " was started by srun (Slurm step " +
                 options.slurm.job_id + "." + options.slurm.step_id +
                 ") without a PMI that Open MPI can use (no PMIX_RANK, PMI_RANK or PMI_FD), "
                 "so MPI_Init could not reach the other tasks. Run srun --mpi=pmix (`srun "
                 "--mpi=list` shows the plugins this Slurm has; MpiDefault=pmix in slurm.conf "
                 "makes it the default), or use gloo: TUTTI_CPU_OPERATIONS=gloo");
}

// Initializes MPI unless the program did; Tutti's MPI is finalized at exit.
void initializeMpi(const BackendOptions& options) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    throwError(StatusCode::kBackend,
               "mpi transport: MPI was already finalized by the program; Tutti must be "
               "initialized before MPI_Finalize");
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
    if (provided != MPI_THREAD_MULTIPLE)
      throwError(StatusCode::kBackend,
                 std::string("mpi transport: the program initialized MPI with ") +
                     threadLevelName(provided) +
                     ", but Tutti's background thread needs MPI_THREAD_MULTIPLE: call "
                     "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let Tutti initialize MPI");
    return;
  }
  checkSlurmPmi(options);
  detail::checkMpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                   "MPI_Init_thread", "mpi transport");
  detail::rememberMpiProcess(options.timeout_seconds);
  on_exit(detail::finalizeMpiAtExit, nullptr);
  if (provided != MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throwError(StatusCode::kBackend,
               std::string("mpi transport: MPI_Init_thread asked for MPI_THREAD_MULTIPLE and "
                           "got ") +
                   threadLevelName(provided) + "; this Open MPI build lacks thread support");
  }
}

class MpiTransport : public Transport {
 public:
  MpiTransport(const BackendOptions& options, int64_t max_message_elements)
      : start_timeout_seconds_(options.start_timeout_seconds) {
    if (max_message_elements < 1 || max_message_elements > INT_MAX)
      throwError(StatusCode::kInvalidArgument,
                 "mpi transport: max message elements must be in [1, INT_MAX], got " +
                     std::to_string(max_message_elements));
    initializeMpi(options);  // MPI stays up until exit, also when this constructor throws
    detail::checkMpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank", "mpi transport");
    detail::checkMpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size", "mpi transport");
    shared_ = std::make_shared<MpiShared>(max_message_elements, start_timeout_seconds_);
  }

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<ControlPlane> makeControlPlane(const std::vector<int>& ranks,
                                                 int id) override {
    return detail::makeMpiControlPlane(makeGroup(ranks, id, 0));
  }
  std::unique_ptr<Backend> makeBackend(const std::vector<int>& ranks, int id) override {
    return detail::makeMpiBackend(makeGroup(ranks, id, 1));
  }

 private:
  // kind 0 = control plane, 1 = data plane: each gets its own communicator.
  MpiGroupInfo makeGroup(const std::vector<int>& ranks, int id, int kind) {
    std::string who = "rank " + std::to_string(rank_) + ": mpi group " + std::to_string(id);
    const std::string wrong = checkGroupRanks(ranks, size_, rank_);
    if (!wrong.empty()) throwError(StatusCode::kInvalidArgument, who + ": " + wrong);
    std::lock_guard<std::mutex> lock(mu_);  // one creation at a time, in call order
    MpiGroupInfo info;
    info.shared = shared_;
    info.poison = poisonFor(id);
    info.ranks = ranks;
    info.id = id;
    info.world_rank = rank_;
    info.comm = detail::makeGroupComm(ranks, id, kind, deadlineAfter(start_timeout_seconds_),
                                      who + (kind ? " data plane" : " control plane") +
                                          ": creating the communicator",
                                      *info.poison, *shared_);
    return info;
  }

  std::shared_ptr<MpiPoison> poisonFor(int id) {
    auto& slot = poisons_[id];
    if (auto existing = slot.lock()) return existing;
    auto created = std::make_shared<MpiPoison>(shared_);
    slot = created;
    return created;
  }

  double start_timeout_seconds_;  // communicator creation
  int rank_ = 0, size_ = 1;
  std::shared_ptr<MpiShared> shared_;  // outlives this transport while a group uses it
  std::mutex mu_;
  std::map<int, std::weak_ptr<MpiPoison>> poisons_;
};

}  // namespace

std::unique_ptr<Transport> makeMpiTransport(const BackendOptions& options,
                                            int64_t max_message_elements) {
  return std::make_unique<MpiTransport>(options, max_message_elements);
}

std::unique_ptr<Transport> makeMpiTransport(const BackendOptions& options) {
  return makeMpiTransport(options, INT_MAX);
}

}  // namespace tutti
