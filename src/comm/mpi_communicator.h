// MPI backend (OpenMPI): used when the job is started by mpirun or srun. Collectives are MPI-3
// non-blocking ones polled against the deadline, so a timeout is an error, not a hang.
#pragma once
#include <memory>

#include "comm/communicator.h"

namespace atl::comm {

// Initialises MPI on first use (MPI_THREAD_MULTIPLE requested; calls are serialised anyway).
// Throws when atoll was built without MPI.
std::unique_ptr<Communicator> make_mpi_communicator(Millis timeout);
bool mpi_available();

}  // namespace atl::comm
