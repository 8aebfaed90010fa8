// MPI baseline: MPI_Allreduce/Allgather/Bcast/Alltoall/Reduce_scatter_block on
// MPI_COMM_WORLD. Needs MPI initialized (initLaunchMpi or Tutti's MPI backend).
#pragma once

#include "bench/baseline.h"

#include <memory>

namespace tutti {
namespace bench {

bool mpiLaunched();  // started by Open MPI (OMPI_COMM_WORLD_SIZE in the environment)
bool initMpiThreadMultiple();  // true if this call initialized MPI
void finalizeMpi();
void abortMpi(int code);  // MPI_Abort when MPI is initialized and not finalized
std::unique_ptr<Baseline> makeMpiBaseline(std::string* why);

}  // namespace bench
}  // namespace tutti
