// Weight sync (rl/weight_sync.h): a 2-rank broadcast leaves every rank's tensors bitwise equal to
// the source's, in several buckets (not one message per tensor, not one for everything); the
// in-process copy does the same.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "comm/communicator.h"
#include "core/threads.h"
#include "parallel/harness.h"
#include "rl/weight_sync.h"

namespace atl::rl {
namespace {

// 40 tensors of assorted sizes (~0.2M floats); rank 0's hold deterministic non-trivial bit
// patterns (negative zeros, subnormals, NaN payloads included), the others garbage.
std::vector<Tensor> make_tensors(bool source, uint64_t salt) {
  std::vector<Tensor> t;
  for (int i = 0; i < 40; ++i) {
    const int64_t n = 1 + (int64_t(i) * 7919) % 9000;
    Tensor x = Tensor::empty({n});
    uint32_t* u = reinterpret_cast<uint32_t*>(x.f32());
    for (int64_t k = 0; k < n; ++k)
      u[k] = source ? uint32_t(parallel::test::mix(uint64_t(i) << 32 | uint64_t(k))) : uint32_t(salt * 2654435761u + k);
    t.push_back(x);
  }
  return t;
}

bool equal_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(a[i].f32(), b[i].f32(), size_t(a[i].numel()) * 4) != 0) return false;
  return true;
}

// A rank of the 2-rank test when ATOLL_RL_SYNC_RANK is set; alone, the in-process copy.
TEST(RlWeightSync, RankProgram) {
  const std::vector<Tensor> want = make_tensors(true, 0);
  if (!std::getenv("ATOLL_RL_SYNC_RANK")) {
    std::vector<Tensor> src = make_tensors(true, 0), dst = make_tensors(false, 9);
    ASSERT_FALSE(equal_bits(dst, want));
    WeightSync ws(src, 0.1);
    SyncStats st = ws.copy_to(dst);
    EXPECT_TRUE(equal_bits(dst, want));
    int64_t bytes = 0;
    for (auto& t : src) bytes += t.numel() * 4;
    EXPECT_EQ(st.bytes, bytes);
    EXPECT_GT(ws.buckets(), 3);
    return;
  }
  set_num_threads(1);
  auto comm = comm::make_communicator("gloo", std::chrono::milliseconds(30000));
  const int r = comm->rank();
  std::vector<Tensor> mine = make_tensors(r == 0, uint64_t(r) + 1);
  if (r != 0) ASSERT_FALSE(equal_bits(mine, want));
  WeightSync ws(mine, 0.1);  // 0.1 MB buckets: several for ~0.7 MB
  EXPECT_GT(ws.buckets(), 3);
  EXPECT_LT(ws.buckets(), 40);
  SyncStats st = ws.broadcast(*comm, 0);
  EXPECT_EQ(st.buckets, ws.buckets());
  EXPECT_TRUE(equal_bits(mine, want)) << "rank " << r << " differs from the source after the broadcast";
  // A second push from rank 1 (roles reversed) reaches rank 0.
  if (r == 1) mine[3].f32()[0] = 42.5f;
  ws.broadcast(*comm, 1);
  EXPECT_EQ(mine[3].f32()[0], 42.5f) << "rank " << r;
}

TEST(RlWeightSync, TwoRanksBroadcastBitwise) {
  const std::string tag = (std::filesystem::temp_directory_path() / ("atoll_rl_sync_" + std::to_string(::getpid()))).string();
  auto codes = parallel::test::run_rank_programs(2, "RlWeightSync.RankProgram", {"ATOLL_RL_SYNC_RANK=1"}, tag, 60);
  for (size_t r = 0; r < codes.size(); ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << ":\n" << parallel::test::read_file(tag + ".log" + std::to_string(r));
    std::filesystem::remove(tag + ".log" + std::to_string(r));
  }
}

}  // namespace
}  // namespace atl::rl
