// Threads: one knob for OpenMP and the BLAS, so that neither oversubscribes the other.
#pragma once

namespace atl {

int num_threads();
// n <= 0 means "all cores" (or OMP_NUM_THREADS when set).
void set_num_threads(int n);

}  // namespace atl
