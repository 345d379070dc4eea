#include "comm/network_partition.h"

#include <atomic>

namespace atl::comm {

namespace {
std::atomic<bool> g_partitioned{false};
}

void partition_this_process() { g_partitioned.store(true, std::memory_order_release); }
bool this_process_partitioned() { return g_partitioned.load(std::memory_order_acquire); }

}  // namespace atl::comm
