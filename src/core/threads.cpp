#include "core/threads.h"

#include <omp.h>

#include <cstdlib>
#include <thread>

// OpenBLAS is linked by the kernels layer; a weak symbol keeps core free of a BLAS dependency.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace atl {

int num_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  if (n <= 0) {
    const char* e = std::getenv("OMP_NUM_THREADS");
    n = e ? std::atoi(e) : 0;
    if (n <= 0) n = int(std::thread::hardware_concurrency());
    if (n <= 0) n = 1;
  }
  omp_set_num_threads(n);
  if (openblas_set_num_threads) openblas_set_num_threads(n);
}

}  // namespace atl
