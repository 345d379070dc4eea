#include "core/server_threads.h"

namespace atl {

void ServerThreads::reap() {
  std::vector<std::thread> finished;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (uint64_t id : done_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;  // already taken by join_all
      finished.push_back(std::move(it->second));
      threads_.erase(it);
    }
    done_.clear();
  }
  for (auto& t : finished) t.join();  // they have only their last lock left to release: quick
}

void ServerThreads::start(std::function<void()> fn) {
  reap();
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t id = next_++;
  // The thread records itself as done under mu_, which is held here until it is in the map.
  threads_.emplace(id, std::thread([this, id, fn = std::move(fn)] {
                     fn();
                     std::lock_guard<std::mutex> done(mu_);
                     done_.push_back(id);
                   }));
}

void ServerThreads::join_all() {
  std::map<uint64_t, std::thread> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    all.swap(threads_);
    done_.clear();
  }
  for (auto& [id, t] : all) t.join();
}

size_t ServerThreads::held() const {
  std::lock_guard<std::mutex> lk(mu_);
  return threads_.size();
}

}  // namespace atl
