// The collective checks every backend runs: each rank builds every rank's input from the same
// formula, so it can compute the serial reference itself and compare with what came back.
#include <algorithm>
#include <cmath>

#include "comm_test_util.h"

namespace atl::comm::test {

namespace {

// Small integers: exact in every dtype, bf16 included, and in sums of a few ranks.
double value(int rank, int64_t i, int salt) { return double((rank * 131 + i * 7 + salt * 13) % 17) - 8; }

Tensor make(DType dt, int64_t n, int rank, int salt) {
  Tensor t = Tensor::empty({n}, dt);
  for (int64_t i = 0; i < n; ++i) {
    double v = value(rank, i, salt);
    switch (dt) {
      case DType::f32: t.data<float>()[i] = float(v); break;
      case DType::bf16: t.data<bf16>()[i] = float_to_bf16(float(v)); break;
      case DType::i32: t.data<int32_t>()[i] = int32_t(v); break;
      case DType::i64: t.data<int64_t>()[i] = int64_t(v); break;
    }
  }
  return t;
}

double get(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.data<float>()[i];
    case DType::bf16: return bf16_to_float(t.data<bf16>()[i]);
    case DType::i32: return t.data<int32_t>()[i];
    case DType::i64: return double(t.data<int64_t>()[i]);
  }
  return 0;
}

double reduce_ref(ReduceOp op, int n, int64_t i, int salt, const std::vector<int>& ranks) {
  double acc = op == ReduceOp::max ? -1e300 : 0;
  for (int r : ranks) acc = op == ReduceOp::max ? std::max(acc, value(r, i, salt)) : acc + value(r, i, salt);
  return op == ReduceOp::avg ? acc / n : acc;
}

void expect_near(double got, double want, DType dt, const std::string& what, int64_t i) {
  // Integers and sums of small integers are exact; avg is rounded once (to bf16 or f32).
  double tol = dt == DType::bf16 ? std::abs(want) * 0.008 + 1e-6 : std::abs(want) * 1e-6 + 1e-6;
  if (!(std::abs(got - want) <= tol)) fail("{}: element {} is {}, expected {}", what, i, got, want);
}

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

const DType kDtypes[] = {DType::f32, DType::bf16, DType::i32, DType::i64};

}  // namespace

int check_all_collectives(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const auto all = iota(n);
  int checks = 0;
  int salt = 0;
  for (DType dt : kDtypes) {
    const bool fp = dt == DType::f32 || dt == DType::bf16;
    for (int64_t len : {int64_t(1), int64_t(7), int64_t(1001)}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        if (op == ReduceOp::avg && !fp) continue;
        ++salt;
        Tensor t = make(dt, len, me, salt);
        c.all_reduce(t, op);
        std::string what = fmt::format("all_reduce {} {} x{}", reduce_op_name(op), dtype_name(dt), len);
        for (int64_t i = 0; i < len; ++i) expect_near(get(t, i), reduce_ref(op, n, i, salt, all), dt, what, i);
        ++checks;
      }
    }
    for (int64_t chunk : {int64_t(1), int64_t(5), int64_t(333)}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        if (op == ReduceOp::avg && !fp) continue;
        ++salt;
        Tensor in = make(dt, chunk * n, me, salt), out = Tensor::empty({chunk}, dt);
        c.reduce_scatter(in, out, op);
        std::string what = fmt::format("reduce_scatter {} {} chunk {}", reduce_op_name(op), dtype_name(dt), chunk);
        for (int64_t i = 0; i < chunk; ++i)
          expect_near(get(out, i), reduce_ref(op, n, me * chunk + i, salt, all), dt, what, i);
        ++checks;
      }
    }
    for (int64_t len : {int64_t(1), int64_t(7), int64_t(501)}) {
      ++salt;
      Tensor in = make(dt, len, me, salt), out = Tensor::empty({len * n}, dt);
      c.all_gather(in, out);
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < len; ++i)
          expect_near(get(out, r * len + i), value(r, i, salt), dt,
                      fmt::format("all_gather {} x{} from rank {}", dtype_name(dt), len, r), i);
      ++checks;
    }
    for (int64_t len : {int64_t(7), int64_t(1001)}) {
      for (int root = 0; root < n; ++root) {
        ++salt;
        Tensor t = make(dt, len, me, salt);
        c.broadcast(t, root);
        for (int64_t i = 0; i < len; ++i)
          expect_near(get(t, i), value(root, i, salt), dt,
                      fmt::format("broadcast {} x{} from root {}", dtype_name(dt), len, root), i);
        ++checks;
      }
    }
    for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(129)}) {
      ++salt;
      Tensor in = make(dt, chunk * n, me, salt), out = Tensor::empty({chunk * n}, dt);
      c.all_to_all(in, out);
      // Chunk r of out is chunk `me` of rank r's input.
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < chunk; ++i)
          expect_near(get(out, r * chunk + i), value(r, me * chunk + i, salt), dt,
                      fmt::format("all_to_all {} chunk {} from rank {}", dtype_name(dt), chunk, r), i);
      ++checks;
    }
    // Ring exchange: isend right, irecv left, both posted before either is waited on.
    for (int64_t len : {int64_t(1), int64_t(1001)}) {
      ++salt;
      int right = (me + 1) % n, left = (me + n - 1) % n;
      Tensor s = make(dt, len, me, salt), r = Tensor::zeros({len}, dt);
      auto ws = c.send_async(s, right, 5);
      auto wr = c.recv_async(r, left, 5);
      wr->wait();
      ws->wait();
      for (int64_t i = 0; i < len; ++i)
        expect_near(get(r, i), value(left, i, salt), dt, fmt::format("send/recv {} x{}", dtype_name(dt), len), i);
      ++checks;
    }
  }
  c.barrier();
  ++checks;

  // Several operations in flight at once, waited for out of order.
  {
    std::vector<Tensor> ts;
    std::vector<WorkPtr> ws;
    for (int k = 0; k < 6; ++k) {
      ts.push_back(make(DType::f32, 257 + k, me, 100 + k));
      ws.push_back(c.all_reduce_async(ts.back(), ReduceOp::sum));
    }
    for (int k = 5; k >= 0; --k) {
      ws[size_t(k)]->wait();
      for (int64_t i = 0; i < 257 + k; ++i)
        expect_near(get(ts[size_t(k)], i), reduce_ref(ReduceOp::sum, n, i, 100 + k, all), DType::f32,
                    fmt::format("async all_reduce #{}", k), i);
    }
    ++checks;
  }

  // Sub-groups: even and odd ranks, ordered by descending rank (key = -rank).
  {
    auto sub = c.split(me % 2, -me);
    if (!sub) fail("split returned no communicator for color {}", me % 2);
    std::vector<int> members;
    for (int r = n - 1; r >= 0; --r)
      if (r % 2 == me % 2) members.push_back(r);
    int want_rank = int(std::find(members.begin(), members.end(), me) - members.begin());
    if (sub->size() != int(members.size()) || sub->rank() != want_rank)
      fail("split: got rank {} of {}, expected {} of {}", sub->rank(), sub->size(), want_rank, members.size());
    if (sub->world_ranks() != members) fail("split: world ranks of the sub-group are wrong");
    Tensor t = make(DType::i64, 33, me, 200);
    sub->all_reduce(t, ReduceOp::sum);
    for (int64_t i = 0; i < 33; ++i)
      expect_near(get(t, i), reduce_ref(ReduceOp::sum, n, i, 200, members), DType::i64, "split all_reduce", i);
    // Rank 0 opts out; the rest form one group.
    auto rest = c.split(me == 0 ? -1 : 0, me);
    if ((me == 0) != (rest == nullptr)) fail("split with a negative color: wrong membership");
    if (rest) {
      Tensor u = make(DType::f32, 9, me, 201);
      rest->all_reduce(u, ReduceOp::max);
      std::vector<int> others(all.begin() + 1, all.end());
      for (int64_t i = 0; i < 9; ++i)
        expect_near(get(u, i), reduce_ref(ReduceOp::max, n - 1, i, 201, others), DType::f32, "split max", i);
    }
    checks += 2;
  }
  c.barrier();
  return checks;
}

}  // namespace atl::comm::test
