// MPI control plane and data-plane backend over one communicator each. Internal to
// backends/mpi (and its tests).
#pragma once

#include "backends/backend.h"
#include "backends/mpi/mpi_common.h"
#include "backends/options.h"

#include <memory>
#include <vector>

namespace tutti {
namespace detail {

// What the control plane and the backend of one group share with the transport.
struct MpiGroupInfo {
  std::shared_ptr<MpiShared> shared;
  std::shared_ptr<MpiPoison> poison;  // one per group id: a timeout fails both planes
  MPI_Comm comm = MPI_COMM_NULL;      // owned; freed unless a request on it was abandoned
  std::vector<int> ranks;
  int id = 0;
  int world_rank = 0;
};

std::unique_ptr<ControlPlane> makeMpiControlPlane(MpiGroupInfo info);
std::unique_ptr<Backend> makeMpiBackend(MpiGroupInfo info);

}  // namespace detail

// makeMpiTransport with a lower cap on the elements one MPI call carries, so that tests can
// exercise chunking and the overflow checks without multi-GiB buffers.
std::unique_ptr<Transport> makeMpiTransport(const BackendOptions& options,
                                            int64_t max_message_elements);

}  // namespace tutti
