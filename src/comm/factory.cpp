// Choosing a backend from the environment, torchrun's conventions first, then mpirun's and
// srun's, so the same binary runs under `atoll launch`, torchrun-style launchers, mpirun and srun.
#include <cstdlib>

#include "comm/communicator.h"
#include "comm/gloo_communicator.h"
#include "comm/launcher_watch.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/tcp_store.h"

namespace atl::comm {

namespace {
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}
int env_int(std::initializer_list<const char*> names, int def) {
  for (const char* n : names)
    if (const char* v = env(n)) {
      char* end = nullptr;
      long x = std::strtol(v, &end, 10);
      ATOLL_CHECK(end != v && *end == 0, "environment variable {}='{}' is not an integer", n, v);
      return int(x);
    }
  return def;
}
}  // namespace

DistEnv DistEnv::from_environment() {
  DistEnv e;
  e.launched_by_mpi = env("OMPI_COMM_WORLD_RANK") || env("PMI_RANK") || env("PMIX_RANK") ||
                      (env("SLURM_PROCID") && !env("RANK"));
  e.rank = env_int({"RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}, 0);
  e.world_size = env_int({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, 1);
  e.local_rank = env_int({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, 0);
  e.local_world_size =
      env_int({"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}, 1);
  if (const char* a = env("MASTER_ADDR")) e.master_addr = a;
  e.master_port = env_int({"MASTER_PORT"}, 0);
  e.store_port = env_int({"ATOLL_STORE_PORT"}, 0);
  e.store_hosted_externally = e.store_port > 0;
  e.store_addr = env("ATOLL_STORE_ADDR") ? env("ATOLL_STORE_ADDR") : e.master_addr;
  if (!e.store_hosted_externally) {
    e.store_addr = e.master_addr;
    e.store_port = e.master_port;
  }
  ATOLL_CHECK(e.world_size >= 1 && e.rank >= 0 && e.rank < e.world_size,
              "RANK={} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={})", e.rank, e.world_size);
  return e;
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend, Millis timeout) {
  start_launcher_watch();  // under `atoll launch`: die with the launcher, saying so
  DistEnv e = DistEnv::from_environment();
  std::string b = backend;
  if (b == "auto") {
    if (e.launched_by_mpi && mpi_available())
      b = "mpi";
    else if (e.world_size > 1)
      b = "gloo";
    else
      b = "single";
  }
  if (b == "single") {
    ATOLL_CHECK(e.world_size == 1, "backend 'single' in a job of WORLD_SIZE={}", e.world_size);
    return make_single_communicator(timeout);
  }
  if (b == "mpi") return make_mpi_communicator(timeout);
  if (b == "gloo") {
#ifdef ATOLL_HAVE_GLOO
    if (e.world_size == 1 && e.store_port == 0) e.master_port = e.store_port = pick_free_port();
    return GlooCommunicator::create(e, timeout);
#else
    fail("atoll was built without Gloo (install libgloo-dev and rebuild)");
#endif
  }
  // "nccl" is asked for by name: "auto" keeps Gloo, because every tensor the engine hands a
  // communicator today lives on the CPU.
  if (b == "nccl") {
#ifdef ATOLL_HAVE_NCCL
    return NcclCommunicator::create(e, timeout);
#else
    fail("backend 'nccl': atoll was built without NCCL (it needs the CUDA toolkit with nccl.h and "
         "libnccl at build time)");
#endif
  }
  fail("unknown communication backend '{}'; use auto, gloo, mpi, nccl or single", backend);
}

}  // namespace atl::comm
