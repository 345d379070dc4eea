// The one-rank communicator and the argument checks every backend shares.
#include <gtest/gtest.h>

#include "comm/communicator.h"

using namespace atl;
using namespace atl::comm;

TEST(SingleComm, CollectivesAreIdentityOrCopy) {
  auto c = make_single_communicator(std::chrono::milliseconds(2000));
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  Tensor t = Tensor::from_vector({1, -2, 3}, {3});
  c->all_reduce(t, ReduceOp::avg);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1, -2, 3}));
  Tensor b = t.to(DType::bf16);
  c->all_reduce(b, ReduceOp::sum);
  EXPECT_EQ(b.to_vector(), (std::vector<float>{1, -2, 3}));
  Tensor out = Tensor::zeros({3});
  c->all_gather(t, out);
  EXPECT_EQ(out.to_vector(), t.to_vector());
  Tensor rs = Tensor::zeros({3});
  c->reduce_scatter(t, rs, ReduceOp::max);
  EXPECT_EQ(rs.to_vector(), t.to_vector());
  c->barrier();
  auto sub = c->split(0, 0);
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(c->split(-1, 0), nullptr);
}

TEST(SingleComm, BadArgumentsAreUserErrors) {
  auto c = make_single_communicator(std::chrono::milliseconds(2000));
  Tensor i = Tensor::zeros({4}, DType::i32);
  EXPECT_THROW(c->all_reduce(i, ReduceOp::avg), Error);  // avg of integers
  Tensor a = Tensor::zeros({4}), b = Tensor::zeros({3});
  EXPECT_THROW(c->all_gather(a, b), Error);
  EXPECT_THROW(c->reduce_scatter(a, b), Error);
  EXPECT_THROW(c->broadcast(a, 1), Error);
  EXPECT_THROW(c->send(a, 0), Error);  // to itself
  Tensor m = Tensor::zeros({2, 3}).transpose(0, 1);
  EXPECT_THROW(c->all_reduce(m), Error);  // not contiguous
  EXPECT_THROW(c->all_reduce(Tensor()), Error);
}

TEST(SingleComm, AsyncWorkCompletesInOrder) {
  auto c = make_single_communicator(std::chrono::milliseconds(2000));
  std::vector<WorkPtr> ws;
  for (int k = 0; k < 10; ++k) ws.push_back(c->all_reduce_async(Tensor::full({5}, float(k))));
  ws.back()->wait();
  for (auto& w : ws) EXPECT_TRUE(w->done());
}

TEST(SingleComm, FactoryPicksSingleWithoutDistributedEnvironment) {
  unsetenv("WORLD_SIZE");
  unsetenv("RANK");
  auto c = make_communicator("auto", std::chrono::milliseconds(2000));
  EXPECT_EQ(c->backend(), "single");
  EXPECT_THROW(make_communicator("nccl-ish"), Error);
}
