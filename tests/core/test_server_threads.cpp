// ServerThreads (core/server_threads.h): a thread per connection, joined once finished, so that a
// long-lived server holds only the threads still serving.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/server_threads.h"

namespace atl {

TEST(ServerThreads, FinishedThreadsAreJoinedByTheNextStartAndLiveOnesAreKept) {
  ServerThreads t;
  std::atomic<int> ran{0};
  for (int i = 0; i < 2000; ++i) {
    t.start([&] { ++ran; });
    // Each task is over before the next start; at most the last few have not recorded it yet.
    while (ran.load() < i + 1) std::this_thread::yield();
    ASSERT_LE(t.held(), 8u) << "after " << i + 1 << " starts";
  }
  // A thread that is still serving is never joined by start(): it stays held, and join_all waits.
  std::atomic<bool> release{false};
  std::atomic<bool> finished{false};
  t.start([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    finished = true;
  });
  for (int i = 0; i < 50; ++i) t.start([&] { ++ran; });
  EXPECT_FALSE(finished);
  EXPECT_GE(t.held(), 1u);
  release = true;
  t.join_all();
  EXPECT_TRUE(finished);
  EXPECT_EQ(t.held(), 0u);
  EXPECT_EQ(ran.load(), 2050);
}

}  // namespace atl
