#include "comm/collective_observer.h"

#include <atomic>

namespace atl::comm {

namespace {
std::atomic<CollectiveObserver*> g_observer{nullptr};
}

void set_collective_observer(CollectiveObserver* o) { g_observer.store(o, std::memory_order_release); }
CollectiveObserver* collective_observer() { return g_observer.load(std::memory_order_acquire); }

}  // namespace atl::comm
