// Compressed gradient exchange across ranks (comm/compressed_allreduce.h, DDP's [parallel] codec)
// and SCAPE (parallel/scape.h). Rank programs are this binary under --gtest_filter=<Suite>.RankProgram
// with a job in the environment (harness.h); without one, the same test runs its one-rank form.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <unistd.h>

#include "comm/compressed_allreduce.h"
#include "core/threads.h"
#include "harness.h"
#include "optim/adams.h"
#include "parallel/ddp.h"
#include "parallel/scape.h"
#include "tensor/safetensors.h"

using namespace atl;
using namespace atl::parallel;
using namespace atl::parallel::test;

namespace {

// Rank q's input: any rank can compute every rank's, to build the expected reduction itself.
std::vector<float> input_of(int q, int64_t n, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double u = double(mix(uint64_t(q) * 1000003 + uint64_t(i) * 7919 + uint64_t(salt)) >> 11) / 9.007199254740992e15;
    v[size_t(i)] = float((u - 0.5) * std::pow(10.0, double((i / 40) % 5) - 2));  // blocks of mixed magnitude
  }
  return v;
}

// decode(encode(x)) chunk by chunk, as the reducer cuts a tensor of n over W ranks.
std::vector<float> chunked_round_trip(const comm::Codec& c, const std::vector<float>& x, int W) {
  const int64_t n = int64_t(x.size()), ch = (n + W - 1) / W;
  std::vector<float> pad(size_t(ch * W), 0.f), out(size_t(ch * W));
  std::copy(x.begin(), x.end(), pad.begin());
  std::vector<uint8_t> buf(size_t(c.encoded_bytes(ch)));
  for (int j = 0; j < W; ++j) {
    c.encode(pad.data() + j * ch, ch, buf.data(), nullptr);
    c.decode(buf.data(), ch, out.data() + j * ch);
  }
  out.resize(size_t(n));
  return out;
}

const char* kCodecs[] = {"int8", "fp8_e4m3", "fp8_e5m2", "nvfp4"};

// Every codec, both all-gather modes: the result must equal, bitwise, the f32 sum (in rank order)
// of every rank's decoded input — re-encoded once when the gather is encoded. A sum accumulated
// in the low precision (re-quantized after each addition) is computed too and must differ, or the
// test could not tell the two apart. Returns the number of failed checks.
int check_reductions(comm::Communicator* comm, const std::string& out) {
  const int W = comm ? comm->size() : 1, me = comm ? comm->rank() : 0;
  const int64_t n = 1001;  // not a multiple of W, nor of a block
  int failed = 0, salt = 0;
  for (const char* name : kCodecs)
    for (bool gather_encoded : {false, true}) {
      ++salt;
      comm::CodecSpec spec;
      spec.codec = name;
      spec.gather_encoded = gather_encoded;
      comm::CompressedAllReducer r(comm, spec);
      std::vector<float> x = input_of(me, n, salt);
      Tensor t = Tensor::from_vector(x, {n});
      r.all_reduce(t, comm::ReduceOp::sum, "t");
      std::vector<float> want(size_t(n), 0.f), lowp;
      for (int q = 0; q < W; ++q) {
        std::vector<float> d = chunked_round_trip(r.codec(), input_of(q, n, salt), W);
        for (int64_t i = 0; i < n; ++i) want[size_t(i)] += d[size_t(i)];
        if (q == 0) lowp = d;
        else {
          for (int64_t i = 0; i < n; ++i) lowp[size_t(i)] += d[size_t(i)];
          lowp = chunked_round_trip(r.codec(), lowp, W);
        }
      }
      if (gather_encoded) want = chunked_round_trip(r.codec(), want, W);
      int64_t bad = 0, differs = 0;
      for (int64_t i = 0; i < n; ++i) {
        bad += t.f32()[i] != want[size_t(i)];
        differs += lowp[size_t(i)] != want[size_t(i)];
      }
      EXPECT_EQ(bad, 0) << name << (gather_encoded ? " (gather encoded)" : " (gather f32)") << " on " << W
                        << " ranks: elements differing from the f32 sum of the decoded inputs";
      // (On two ranks an encoded gather IS one low-precision rounding of the f32 sum: no contrast.)
      const bool contrast = W > 2 || (W == 2 && !gather_encoded);
      if (contrast) {
        EXPECT_GT(differs, 0) << name << ": a low-precision accumulation gives the same result";
      }
      const int64_t ch = (n + W - 1) / W, words = (r.codec().encoded_bytes(ch) + 3) / 4;
      EXPECT_EQ(r.stats().bytes_sent, int64_t(W - 1) * (words * 4 + (gather_encoded ? words * 4 : ch * 4))) << name;
      failed += bad > 0 || (contrast && differs == 0);
      if (!out.empty()) write_floats(out + "." + name + (gather_encoded ? "_enc" : "_f32") + "." + std::to_string(me),
                                     t.to_vector());
    }
  // The reduce-scatter (ZeRO-2): rank j's chunk is, bitwise, the f32 sum in rank order of every
  // rank's decoded chunk j; a low-precision accumulation of the same inputs must differ.
  for (const char* name : kCodecs) {
    ++salt;
    comm::CodecSpec spec;
    spec.codec = name;
    comm::CompressedAllReducer r(comm, spec);
    const int64_t c = 37;  // not a block multiple
    Tensor in = Tensor::from_vector(input_of(me, c * W, salt), {c * W}), out = Tensor::zeros({c});
    r.reduce_scatter(in, out, comm::ReduceOp::sum, "rs");
    std::vector<float> want(size_t(c), 0.f), lowp;
    for (int q = 0; q < W; ++q) {
      std::vector<float> d = chunked_round_trip(r.codec(), input_of(q, c * W, salt), W);
      std::vector<float> mine(d.begin() + me * c, d.begin() + (me + 1) * c);
      for (int64_t i = 0; i < c; ++i) want[size_t(i)] += mine[size_t(i)];
      if (q == 0) lowp = mine;
      else {
        for (int64_t i = 0; i < c; ++i) lowp[size_t(i)] += mine[size_t(i)];
        lowp = chunked_round_trip(r.codec(), lowp, 1);
      }
    }
    int64_t bad = 0, differs = 0;
    for (int64_t i = 0; i < c; ++i) {
      bad += out.f32()[i] != want[size_t(i)];
      differs += lowp[size_t(i)] != want[size_t(i)];
    }
    EXPECT_EQ(bad, 0) << name << " reduce-scatter on " << W << " ranks: elements differing from the f32 sum";
    if (W > 1) {
      EXPECT_GT(differs, 0) << name << ": a low-precision accumulation gives the same result";
    }
    const int64_t words = (r.codec().encoded_bytes(c) + 3) / 4;
    EXPECT_EQ(r.stats().bytes_sent, int64_t(W - 1) * words * 4) << name;
    failed += bad > 0 || (W > 1 && differs == 0);
  }
  // Stochastic rounding: seeds differ per rank and call, yet every rank ends with the same values.
  comm::CodecSpec sr;
  sr.codec = "nvfp4";
  sr.stochastic = true;
  sr.seed = 5;
  comm::CompressedAllReducer r(comm, sr);
  Tensor t = Tensor::from_vector(input_of(me, n, 99), {n});
  r.all_reduce(t, comm::ReduceOp::avg, "t");
  if (!out.empty()) write_floats(out + ".nvfp4_sr." + std::to_string(me), t.to_vector());

  // GIFT through the reducer: a 96 x 128 matrix of rank-4 structure plus noise per rank. Every
  // rank must build the same transform from the reduced gradient (the results are compared
  // across ranks bitwise), the transform must switch on after the first call, and the result
  // stays within FP8's relative error of the exact sum (2^-4 per element of the transformed
  // matrix, kappa <= 64 back: checked loosely as 0.1 of the Frobenius norm).
  comm::CodecSpec gs;
  gs.codec = "gift_fp8";
  comm::CompressedAllReducer gr(comm, gs);
  const int64_t R = 96, C = 128;
  for (int call = 0; call < 4; ++call) {
    std::vector<float> sum(size_t(R * C), 0.f), mine;
    for (int q = 0; q < W; ++q) {
      std::vector<float> g(size_t(R * C));
      for (int64_t i = 0; i < R; ++i)
        for (int64_t j = 0; j < C; ++j) {
          double v = 0.05 * (double(mix(uint64_t(q * 7 + call) * 1000003 + uint64_t(i * C + j)) >> 11) / 9.007e15 - 0.5);
          for (int k = 0; k < 4; ++k)
            v += (4.0 - k) * std::sin(0.1 * double((k + 1) * i) + call * 0.01) * std::cos(0.07 * double((k + 2) * j));
          g[size_t(i * C + j)] = float(v);
        }
      for (size_t e = 0; e < g.size(); ++e) sum[e] += g[e];
      if (q == me) mine = g;
    }
    Tensor t2 = Tensor::from_vector(mine, {R * C});
    gr.all_reduce(t2, comm::ReduceOp::sum, "w", {{0, R, C}});
    double err = 0, nrm = 0;
    for (size_t e = 0; e < sum.size(); ++e) {
      err += (double(t2.f32()[e]) - sum[e]) * (double(t2.f32()[e]) - sum[e]);
      nrm += double(sum[e]) * sum[e];
    }
    EXPECT_LT(std::sqrt(err / nrm), 0.1) << "GIFT call " << call;
    if (!out.empty()) write_floats(out + ".gift" + std::to_string(call) + "." + std::to_string(me), t2.to_vector());
  }
  EXPECT_EQ(gr.stats().gift_active, 1) << "GIFT should transform an anisotropic matrix after the first call";
  failed += gr.stats().gift_active != 1;
  return failed;
}

}  // namespace

TEST(CompressedAllReduce, RankProgram) {
  if (const char* tag = std::getenv("ATOLL_CODEC_JOB")) {
    set_num_threads(1);
    auto c = comm::make_communicator("gloo", std::chrono::milliseconds(20000));
    check_reductions(c.get(), tag);
    return;
  }
  auto single = comm::make_single_communicator();
  EXPECT_EQ(check_reductions(single.get(), ""), 0);
}

TEST(CompressedAllReduce, TwoAndFourRanksEqualTheF32SumOfTheDecodedInputs) {
  for (int world : {2, 4}) {
    std::string tag = fmt::format("/tmp/atoll_codec_{}_{}", getpid(), world);
    std::vector<int> codes = run_rank_programs(world, "CompressedAllReduce.RankProgram", {"ATOLL_CODEC_JOB=" + tag}, tag, 60);
    std::vector<std::string> kinds = {"nvfp4_sr", "gift0", "gift1", "gift2", "gift3"};
    for (const char* c : kCodecs)
      for (const char* g : {"_f32", "_enc"}) kinds.push_back(std::string(c) + g);
    auto res = collect_kinds(tag, codes, kinds, fmt::format("compressed all-reduce on {} ranks", world));
    EXPECT_EQ(res.size(), kinds.size()) << "every rank must succeed and agree";
  }
}

// A rank whose codec differs (here one this build does not know) is refused on every rank at
// setup, before the first step, each naming every rank's setting.
TEST(CodecMismatch, RankProgram) {
  const char* tag = std::getenv("ATOLL_CODEC_MISMATCH");
  if (!tag) {  // one rank: an unknown codec is refused with the valid names
    nn::GPT model(tiny_model());
    ParallelConfig pc;
    pc.codec.codec = "int9";
    auto single = comm::make_single_communicator();
    try {
      comm::CompressedAllReducer r(single.get(), pc.codec);
      ADD_FAILURE() << "codec int9 accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("int8"), std::string::npos) << e.what();
    }
    return;
  }
  set_num_threads(1);
  auto c = comm::make_communicator("gloo", std::chrono::milliseconds(20000));
  nn::GPT model(tiny_model());
  model.init_weights(7);
  ParallelConfig pc;
  pc.codec.codec = c->rank() == 1 ? "int9" : "int8";
  pc.codec.where = "job.toml:3";
  std::string msg = "accepted";
  try {
    auto dp = make_data_parallel(model, c.get(), pc, AdamWConfig{});
  } catch (const std::exception& e) {
    msg = e.what();
  }
  std::FILE* f = std::fopen((std::string(tag) + ".msg." + std::to_string(c->rank())).c_str(), "w");
  std::fputs(msg.c_str(), f);
  std::fclose(f);
}

TEST(CodecMismatch, AnUnknownCodecOnOneRankIsRefusedOnEveryRankBeforeStepOne) {
  std::string tag = fmt::format("/tmp/atoll_codecmm_{}", getpid());
  std::vector<int> codes = run_rank_programs(2, "CodecMismatch.RankProgram", {"ATOLL_CODEC_MISMATCH=" + tag}, tag, 60);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(codes[size_t(r)], 0) << read_file(tag + ".log" + std::to_string(r));
    std::remove((tag + ".log" + std::to_string(r)).c_str());
    std::string f = tag + ".msg." + std::to_string(r);
    std::string m = read_file(f);
    std::remove(f.c_str());
    EXPECT_NE(m.find("ranks disagree on the gradient codec"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_NE(m.find("rank 0: codec=int8"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1: codec=int9"), std::string::npos) << m;
    if (r == 1) {
      EXPECT_NE(m.find("'int9' (job.toml:3) is not a known codec"), std::string::npos) << m;
    }
  }
}

// DDP: codec "none" is plain DDP (equal to one rank at twice the batch to the data-parallel
// tests' 1e-6, the same reductions in the same order); int8 with error feedback trains and ends
// close to it: int8's error is ~1/254 of a block's maximum, but AdamW's first steps are nearly
// sign steps, so a small gradient whose rounding flips its sign moves its weight by 2 lr: the
// bound is a tenth of the distance the parameters travel (measured: 5%).
TEST(DDPCodec, NoneIsUnchangedAndInt8StaysClose) {
  Job j;
  j.batch = 2;
  j.steps = 3;
  std::vector<float> none = run_ranks(2, j);
  ASSERT_FALSE(none.empty());
  set_num_threads(1);
  Job ref = j;
  ref.batch = 4;
  std::vector<float> one = run_job(nullptr, ref);
  EXPECT_LT(rel_diff(none, one), 1e-6);
  Job z;
  z.steps = 0;
  double moved = rel_diff(one, run_job(nullptr, z));
  ASSERT_GT(moved, 1e-3);
  j.codec = "int8";
  j.error_feedback = true;
  std::vector<float> q = run_ranks(2, j);
  ASSERT_FALSE(q.empty());
  double d = rel_diff(q, none);
  std::printf("int8 DDP: relative difference to f32 DDP %.2e (parameters moved %.2e)\n", d, moved);
  EXPECT_GT(d, 0.0) << "int8 changed nothing: was the codec applied?";
  EXPECT_LT(d, 0.1 * moved);
}

// SCAPE at 90% sparsity, 2 ranks, stopped after 2 of 4 steps and resumed from the checkpoint:
// bitwise the run that never stopped. The checkpoint must carry every rank's unsent gradient
// (non-zero at 90% sparsity) and the mask the third step uses; with either missing the third
// step exchanges other values. Also resumed under one rank from the 2-rank checkpoint (the
// residuals summed onto it): it trains on, not bitwise (another world), but loads.
TEST(Scape, StoppedAndResumedIsBitExact) {
  std::string ck = fmt::format("/tmp/atoll_scape_ck_{}.safetensors", getpid());
  Job j;
  j.batch = 2;
  j.optim = "adams";
  j.strategy = "scape";
  j.scape_sparsity = 0.9;
  j.steps = 4;
  std::vector<float> full = run_ranks(2, j);
  ASSERT_FALSE(full.empty());
  Job a = j;
  a.steps = 2;
  a.save = ck;
  std::vector<float> half = run_ranks(2, a);
  ASSERT_FALSE(half.empty());
  EXPECT_GT(rel_diff(full, half), 1e-4) << "steps 3 and 4 must move the parameters";
  {
    TensorFile f = load_safetensors(ck);
    const Tensor* e1 = f.find("opt.scape.residual.rank1");
    ASSERT_TRUE(e1) << "no residual of rank 1 in the checkpoint";
    double s = 0;
    for (float v : e1->contiguous().to_vector()) s += std::fabs(v);
    EXPECT_GT(s, 0.0) << "rank 1's unsent gradient is zero at 90% sparsity";
    ASSERT_TRUE(f.find("opt.scape.mask"));
  }
  Job b = j;
  b.steps = 2;
  b.start_step = 2;
  b.load = ck;
  std::vector<float> resumed = run_ranks(2, b);
  ASSERT_FALSE(resumed.empty());
  EXPECT_EQ(rel_diff(resumed, full), 0.0) << "the resumed SCAPE run differs from the one that never stopped";
  set_num_threads(1);
  Job one = b;
  one.batch = 4;
  std::vector<float> o = run_job(nullptr, one);
  EXPECT_LT(rel_diff(o, full), 0.05) << "the one-rank resume went astray";
  std::remove(ck.c_str());
}

// ZeRO-1 (all-reduce) and ZeRO-2 (reduce-scatter) with int8 and error feedback: codec "none" is
// the plain strategy; int8 trains and ends close to it, under the same bound as DDP's (a tenth of
// the distance the parameters travel; see DDPCodec above). ZeRO-3 with a codec is refused.
TEST(ZeroCodec, Int8StaysCloseToF32UnderZeroOneAndTwo) {
  Job z;
  z.steps = 0;
  set_num_threads(1);
  std::vector<float> init = run_job(nullptr, z);
  for (const char* strategy : {"zero1", "zero2"}) {
    Job j;
    j.strategy = strategy;
    j.batch = 2;
    j.steps = 3;
    std::vector<float> f32 = run_ranks(2, j);
    ASSERT_FALSE(f32.empty());
    double moved = rel_diff(f32, init);
    ASSERT_GT(moved, 1e-3);
    j.codec = "int8";
    j.error_feedback = true;
    std::vector<float> q = run_ranks(2, j);
    ASSERT_FALSE(q.empty());
    double d = rel_diff(q, f32);
    std::printf("int8 %s: relative difference to f32 %.2e (parameters moved %.2e)\n", strategy, d, moved);
    EXPECT_GT(d, 0.0) << strategy << ": int8 changed nothing: was the codec applied?";
    EXPECT_LT(d, 0.1 * moved) << strategy;
  }
  nn::GPT model(tiny_model());
  ParallelConfig pc;
  pc.strategy = "zero3";
  pc.codec.codec = "int8";
  try {
    make_data_parallel(model, nullptr, pc, AdamWConfig{});
    ADD_FAILURE() << "zero3 with a codec accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("'ddp', 'zero1' or 'zero2'"), std::string::npos) << e.what();
  }
}

// SCAPE at sparsity 0 sends every coordinate every step: it is DDP with AdamS, bitwise on two
// ranks (the two-term sums are exact in any order; the update is AdamS's expression).
TEST(Scape, ZeroSparsityEqualsDenseAdamSBitwise) {
  Job j;
  j.batch = 2;
  j.steps = 4;
  j.optim = "adams";
  std::vector<float> dense = run_ranks(2, j);
  j.strategy = "scape";
  j.scape_sparsity = 0;
  std::vector<float> scape = run_ranks(2, j);
  ASSERT_FALSE(dense.empty());
  ASSERT_FALSE(scape.empty());
  EXPECT_EQ(rel_diff(scape, dense), 0.0);
  j.scape_sparsity = 0.9;  // and sparsity changes the result (so the comparison can fail)
  std::vector<float> sparse = run_ranks(2, j);
  EXPECT_GT(rel_diff(sparse, dense), 0.0);
}

// SCAPE at 90% and 99% on 2 and 3 ranks: every rank ends with the same parameters (run_ranks
// checks), the loss falls, and the bytes sent, indices included, are the stated fraction of DDP's.
TEST(Scape, RankProgram) {
  const char* job = std::getenv("ATOLL_SCAPE_JOB");
  set_num_threads(1);
  std::unique_ptr<comm::Communicator> c;
  double sparsity = 0.9;
  if (job) {
    c = comm::make_communicator("gloo", std::chrono::milliseconds(20000));
    sparsity = std::atof(job);
  }
  nn::GPT model(tiny_model());
  model.init_weights(7);
  ParallelConfig pc;
  pc.strategy = "scape";
  pc.scape_sparsity = sparsity;
  auto dp = make_data_parallel(model, c.get(), pc, AdamWConfig{},
                               std::make_unique<AdamS>(model.param_refs(), AdamSConfig{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}));
  const int W = dp->world(), me = dp->rank();
  double first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    Tensor x = Tensor::empty({4, 12}, DType::i32), y = Tensor::empty({4, 12}, DType::i32);
    for (int i = 0; i < 48; ++i) {  // a learnable rule: y = (3 x + 1) mod 64
      int32_t t = int32_t(mix(uint64_t(s) * 977 + uint64_t(me) * 100003 + uint64_t(i)) % 64);
      x.i32()[i] = t;
      y.i32()[i] = (3 * t + 1) % 64;
    }
    dp->zero_grad();
    Tensor loss = model.loss(x, y);
    backward(loss, 1.f);
    dp->finish_backward();
    dp->step({1.f, 1.f});
    double l = dp->average(double(loss.f32()[0]));
    if (s == 0) first = l;
    last = l;
  }
  auto& sc = dynamic_cast<Scape&>(*dp);
  const ScapeStats& st = sc.stats();
  // 30 steps of a tiny model: dense AdamS ends near 1.1 from 4.16, 90% near 1.1, 99% near 3.5
  // (each coordinate is sent about once in 100 steps).
  EXPECT_LT(last, first * (sparsity >= 0.99 ? 0.9 : 0.5)) << "SCAPE at " << sparsity << " did not train";
  const int64_t n = model.flat_values().numel();
  EXPECT_NEAR(double(sc.mask_size()) / double(n), 1 - sparsity, 0.002 + 1.0 * W / double(n));
  if (W > 1) {
    // Values: 2 (W-1)/W of the mask in f32; indices: (W-1) shards of int32 or a bitmap; the
    // first step is dense. DDP: 2 (W-1)/W n f32 a step.
    double per_step = (2.0 * (W - 1) / W * (1 - sparsity) * 4 + (W - 1) * std::min(4 * (1 - sparsity), 1.0 / 8) / W) /
                      (2.0 * (W - 1) / W * 4);
    double expect = (1.0 + 29 * per_step) / 30;
    std::printf("SCAPE %.2f on %d ranks: bytes %.4f of DDP's (values %lld, indices %lld, dense %lld); loss %.3f -> %.3f\n",
                sparsity, W, st.ratio(), (long long)st.value_bytes, (long long)st.index_bytes,
                (long long)st.dense_bytes, first, last);
    EXPECT_NEAR(st.ratio(), expect, 0.01 * expect + 0.002);
    EXPECT_LT(per_step, sparsity >= 0.99 ? 0.03 : 0.15);
  }
  if (job) {
    std::vector<std::pair<std::string, Tensor>> msd, osd;
    dp->full_state(msd, osd);
    std::vector<float> p;
    for (auto& [nm, t] : msd) {
      Tensor cc = t.contiguous();
      p.insert(p.end(), cc.f32(), cc.f32() + cc.numel());
    }
    write_floats(fmt::format("/tmp/atoll_scape_{}.params.{}", job, me), p);
  }
}

TEST(Scape, NinetyAndNinetyNinePercentTrainAndSendTheStatedBytes) {
  for (const char* sp : {"0.9", "0.99"})
    for (int world : {2, 3}) {
      std::string tag = fmt::format("/tmp/atoll_scapej_{}_{}", getpid(), world);
      std::vector<int> codes = run_rank_programs(world, "Scape.RankProgram", {std::string("ATOLL_SCAPE_JOB=") + sp}, tag, 90);
      for (int r = 0; r < world; ++r) {
        std::string log = read_file(tag + ".log" + std::to_string(r));
        EXPECT_EQ(codes[size_t(r)], 0) << "rank " << r << ":\n" << log;
        if (r == 0) std::printf("%s", log.substr(0, log.find("[       OK") == std::string::npos ? log.size() : log.find("[       OK")).c_str());
        std::remove((tag + ".log" + std::to_string(r)).c_str());
      }
      std::vector<float> p0;
      for (int r = 0; r < world; ++r) {
        std::string f = fmt::format("/tmp/atoll_scape_{}.params.{}", sp, r);
        std::vector<float> p = read_floats(f);
        std::remove(f.c_str());
        if (r == 0) p0 = p;
        else EXPECT_EQ(rel_diff(p, p0), 0.0) << "rank " << r << " of " << world << " at sparsity " << sp;
      }
    }
}
