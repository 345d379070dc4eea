// Pseudo-gradient exchanges through codecs (lowcomm/exchange_codec.cpp) across 2 and 4 ranks, as
// DiLoCo calls them: the mean every rank gets back is bit-identical on every rank and within the
// format's stated bound (docs/codecs.md) of the exact f32 mean; error feedback carries what was
// lost into the next exchange and survives state()/load(); the [lowcomm] keys are read and
// checked; encoded exchanges overlap (start() returns before the peers arrive) with the
// synchronous path's bits, GIFT's included. (Whole runs — islands bitwise equal after every outer step, bit-exact resume with a
// codec, a codec mismatch across islands refused — are in test_islands.cpp.)
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/threads.h"
#include "harness.h"
#include "lowcomm/exchange.h"

using namespace atl;
using namespace atl::parallel::test;

namespace {

// Rank q's pseudo-gradient: blocks of 40 values spanning five decades (a model's layers differ so).
std::vector<float> input_of(int q, int64_t n, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double u = double(mix(uint64_t(q) * 1000003 + uint64_t(i) * 7919 + uint64_t(salt)) >> 11) / 9.007199254740992e15;
    v[size_t(i)] = float((u - 0.5) * std::pow(10.0, double((i / 40) % 5) - 3));
  }
  return v;
}

// The format's bound on |decode(encode(x)) - x| per element, round to nearest (docs/codecs.md):
//  int8  s/2, s = block max / 127;  fp8  max(2^-(m+1) |x|, s 2^(emin-m-1)), s = block max / fmax;
//  nvfp4 max(|x|/4, S/4), S <= block max / 6 (1 + 2^-3) + s_t 2^-9, s_t = chunk max / (6 448);
// plus 2^-21 of the block max for the f32 arithmetic around the rounding. The reducer encodes
// each of the W chunks of ceil(n/W) on its own, so blocks (and NVFP4's tensor scale) start at
// each chunk. Every term grows with |x| and the block max, so a bound computed from an upper
// bound of |x| bounds x too.
std::vector<double> bounds(const std::string& codec, const std::vector<double>& ax, int W) {
  const int64_t n = int64_t(ax.size()), c = (n + W - 1) / W, B = codec == "nvfp4" ? 16 : 32;
  std::vector<double> out(ax.size());
  for (int64_t c0 = 0; c0 < n; c0 += c) {
    const int64_t c1 = std::min(n, c0 + c);
    double tmax = 0;
    for (int64_t i = c0; i < c1; ++i) tmax = std::max(tmax, ax[size_t(i)]);
    for (int64_t b = c0; b < c1; b += B) {
      double amax = 0;
      for (int64_t i = b; i < std::min(c1, b + B); ++i) amax = std::max(amax, ax[size_t(i)]);
      const double tiny = double(std::numeric_limits<float>::min());
      for (int64_t i = b; i < std::min(c1, b + B); ++i) {
        double a = ax[size_t(i)], e;
        if (codec == "int8") {
          e = std::max(amax / 127, tiny) / 2;
        } else if (codec == "nvfp4") {
          double st = std::max(tmax / (6 * 448.0), tiny);
          e = std::max(a / 4, (amax / 6 * 1.125 + st * std::ldexp(1.0, -9)) / 4);
        } else {
          bool e4 = codec == "fp8_e4m3";
          int m = e4 ? 3 : 2, emin = e4 ? -6 : -14;
          double s = std::max(amax / (e4 ? 448.0 : 57344.0), tiny);
          e = std::max(std::ldexp(a, -(m + 1)), s * std::ldexp(1.0, emin - m - 1));
        }
        out[size_t(i)] = e + amax * std::ldexp(1.0, -21);
      }
    }
  }
  return out;
}

struct Case {
  const char* codec;
  const char* rounding;
};
const Case kCases[] = {{"int8", "nearest"}, {"fp8_e4m3", "nearest"}, {"fp8_e5m2", "nearest"}, {"nvfp4", "stochastic"}};

std::unique_ptr<lowcomm::PseudoGradientExchange> make(const Case& k, bool ef, comm::Communicator* comm) {
  Config cfg = Config::parse(fmt::format("[lowcomm]\nexchange = \"{}\"\ncodec_rounding = \"{}\"\nerror_feedback = {}\n",
                                         k.codec, k.rounding, ef ? "true" : "false"),
                             "exchange.toml");
  comm::CodecSpec spec = lowcomm::exchange_spec(cfg);
  cfg.finish();
  auto ex = lowcomm::exchange_registry().get(spec.codec)(spec);
  ex->setup(comm);
  return ex;
}

// One exchange of every case: within the bound of the exact mean (stochastic rounding: twice the
// bound, its grid spacing being at most two nearest-rounding bounds), and not exact (the codec
// ran). The local encode's error averages over the ranks' bounds; the owner's re-encode of the
// f32 mean adds the bound of a value no larger than |mean| plus that first error. Then error
// feedback: a second exchange of the same inputs sends them plus the first residual, so the two
// exchanges together are within one round's bound of twice the mean — also after the state went
// through state()/load() into a fresh exchange. Writes every result for the cross-rank check.
int check_exchanges(comm::Communicator* comm, const std::string& out) {
  const int W = comm->size(), me = comm->rank();
  const int64_t n = 1001;  // not a multiple of W nor of a block
  int failed = 0, salt = 0;
  for (const Case& k : kCases) {
    ++salt;
    const double sr = std::string(k.rounding) == "stochastic" ? 2.0 : 1.0;
    std::vector<double> mean(size_t(n), 0.0), in_err(size_t(n), 0.0);
    for (int q = 0; q < W; ++q) {
      std::vector<float> x = input_of(q, n, salt);
      std::vector<double> ax(x.begin(), x.end());
      for (auto& v : ax) v = std::fabs(v);
      std::vector<double> b = bounds(k.codec, ax, W);
      for (int64_t i = 0; i < n; ++i) {
        mean[size_t(i)] += double(x[size_t(i)]) / W;
        in_err[size_t(i)] += sr * b[size_t(i)] / W;
      }
    }
    std::vector<double> z(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) z[size_t(i)] = std::fabs(mean[size_t(i)]) + in_err[size_t(i)];
    std::vector<double> re_err = bounds(k.codec, z, W);
    auto ex = make(k, true, comm);
    Tensor t = Tensor::from_vector(input_of(me, n, salt), {n});
    ex->start(t, comm, "g")();
    int64_t bad = 0, exact = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      double err = std::fabs(double(t.f32()[i]) - mean[size_t(i)]), bd = in_err[size_t(i)] + sr * re_err[size_t(i)];
      bad += err > bd;
      exact += err == 0;
      worst = std::max(worst, err / bd);
    }
    EXPECT_EQ(bad, 0) << k.codec << " on " << W << " ranks: elements beyond the format's bound (worst " << worst
                      << " of it)";
    EXPECT_LT(exact, n / 2) << k.codec << ": the mean came back (nearly) exact: was the codec applied?";
    if (me == 0) std::printf("%s on %d ranks: worst error %.3f of the bound\n", k.codec, W, worst);
    failed += bad > 0 || exact >= n / 2;
    write_floats(out + "." + k.codec + "." + std::to_string(me), t.to_vector());

    // Error feedback, through a checkpoint: the fresh exchange continues where the first stopped.
    auto resumed = make(k, true, comm);
    resumed->load(ex->state(), "test state");
    EXPECT_FALSE(ex->state().empty()) << k.codec << ": no error-feedback state to save";
    Tensor t2 = Tensor::from_vector(input_of(me, n, salt), {n});
    Tensor t3 = Tensor::from_vector(input_of(me, n, salt), {n});
    ex->start(t2, comm, "g")();
    resumed->start(t3, comm, "g")();
    int64_t differ = 0, bad2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      differ += t2.f32()[i] != t3.f32()[i];
      double two = double(t.f32()[i]) + double(t2.f32()[i]);
      bad2 += std::fabs(two - 2 * mean[size_t(i)]) > 2 * (in_err[size_t(i)] + sr * re_err[size_t(i)]);
    }
    EXPECT_EQ(differ, 0) << k.codec << ": the resumed exchange differs from the one that went on";
    EXPECT_EQ(bad2, 0) << k.codec << ": two exchanges with error feedback drift from twice the mean";
    failed += differ > 0 || bad2 > 0;
    write_floats(out + "." + k.codec + "_ef." + std::to_string(me), t2.to_vector());
  }
  return failed;
}

// A rows x cols matrix of rank 2 (the same directions every round, as a gradient's geometry
// persists) plus 1% noise that differs by rank and round, row-major: anisotropic, so GIFT
// transforms it.
std::vector<float> low_rank(int q, int64_t rows, int64_t cols, int salt) {
  std::vector<float> v(size_t(rows * cols));
  auto u = [&](uint64_t i) { return double(mix(i * 7919 + 104729) >> 11) / 9.007199254740992e15 - 0.5; };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v[size_t(r * cols + c)] =
          float(u(uint64_t(r)) * u(uint64_t(c) + 5000) * 4 + u(uint64_t(r) + 900) * u(uint64_t(c) + 7000) +
                0.01 * u(uint64_t(q) * 1000003 + uint64_t(salt) * 7777777 + uint64_t(r * cols + c) + 99));
  return v;
}

// Overlap: start() returns while a peer has not started yet (rank 1 arrives 2 s late), the
// exchange completes in the function it returns, and exchanges left in flight while other
// collectives run on the same communicator give the synchronous path's bits (int8 with error
// feedback over two rounds of two keys; GIFT's gift_int8 over one key holding a 64 x 96 matrix
// of rank 2 plus noise between two vectors). GIFT's round trip: once its transform is active the
// mean is the exact mean within a loose 3% (relative Frobenius; the int8 grid alone gives ~0.3%,
// and T^-1 amplifies its rounding by at most max_shrink along k directions only — a transform
// not undone would be off by O(1)); its geometry goes through state()/load() bit-exact.
int check_overlap(comm::Communicator* comm, const std::string& out) {
  const int me = comm->rank(), W = comm->size();
  int failed = 0;
  const Case k8{"int8", "nearest"};
  {
    auto ex = make(k8, true, comm);
    Tensor t = Tensor::from_vector(input_of(me, 1001, 7), {1001});
    if (me == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    auto t0 = std::chrono::steady_clock::now();
    auto fin = ex->start(t, comm, "late");
    double started = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fin();
    double done = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (me == 0) {
      std::printf("rank 0: start() returned after %.3f s, the exchange completed after %.3f s\n", started, done);
      EXPECT_LT(started, 1.0) << "start() waited for the late peer: the encoded exchange is synchronous";
      EXPECT_GT(done, 1.0) << "the exchange completed before the late peer had started";
      failed += started >= 1.0 || done <= 1.0;
    }
  }
  auto rounds = [&](lowcomm::PseudoGradientExchange& ex, bool overlap) {
    std::vector<float> got;
    for (int round = 0; round < 2; ++round) {
      Tensor a = Tensor::from_vector(input_of(me, 1001, 11 + round), {1001});
      Tensor b = Tensor::from_vector(input_of(me, 517, 13 + round), {517});
      if (overlap) {
        auto fa = ex.start(a, comm, "f0");
        auto fb = ex.start(b, comm, "f1");
        Tensor other = Tensor::full({64}, float(me + 1));
        comm->all_reduce(other);  // traffic of its own while both are in flight (DDP's, say)
        EXPECT_EQ(other.f32()[0], float(W * (W + 1) / 2));
        fb();
        fa();
      } else {
        ex.start(a, comm, "f0")();
        ex.start(b, comm, "f1")();
      }
      auto va = a.to_vector(), vb = b.to_vector();
      got.insert(got.end(), va.begin(), va.end());
      got.insert(got.end(), vb.begin(), vb.end());
    }
    return got;
  };
  auto sync_ex = make(k8, true, comm), async_ex = make(k8, true, comm);
  std::vector<float> s1 = rounds(*sync_ex, false), s2 = rounds(*async_ex, true);
  EXPECT_EQ(max_rel(s1, s2), 0.0) << "overlapped int8 exchanges differ from synchronous ones";
  failed += max_rel(s1, s2) != 0.0;
  write_floats(out + ".overlap." + std::to_string(me), s2);

  // GIFT: [40 values | 64 x 96 matrix | 23 values].
  const int64_t R = 64, C = 96, n = 40 + R * C + 23;
  const std::vector<comm::MatrixSpan> mats = {{40, R, C}};
  auto gift_input = [&](int q, int round) {
    std::vector<float> v = input_of(q, n, 20 + round), m = low_rank(q, R, C, round);
    std::copy(m.begin(), m.end(), v.begin() + 40);
    return v;
  };
  const Case kg{"gift_int8", "nearest"};
  auto g_sync = make(kg, true, comm), g_async = make(kg, true, comm);
  std::vector<float> gs, ga;
  for (int round = 0; round < 3; ++round) {
    Tensor a = Tensor::from_vector(gift_input(me, round), {n}), b = a.clone();
    g_sync->start(a, comm, "pg", mats)();
    auto fin = g_async->start(b, comm, "pg", mats);
    Tensor other = Tensor::full({8}, 1.f);
    comm->all_reduce(other);
    fin();
    auto va = a.to_vector(), vb = b.to_vector();
    gs.insert(gs.end(), va.begin(), va.end());
    ga.insert(ga.end(), vb.begin(), vb.end());
    // The exact mean of the matrix, against what came back.
    double num = 0, den = 0;
    std::vector<double> mean(size_t(R * C), 0.0);
    for (int q = 0; q < W; ++q) {
      std::vector<float> x = gift_input(q, round);
      for (int64_t i = 0; i < R * C; ++i) mean[size_t(i)] += double(x[size_t(40 + i)]) / W;
    }
    for (int64_t i = 0; i < R * C; ++i) {
      double e = double(va[size_t(40 + i)]) - mean[size_t(i)];
      num += e * e;
      den += mean[size_t(i)] * mean[size_t(i)];
    }
    const double rel = std::sqrt(num / den);
    if (me == 0) std::printf("gift_int8 round %d: relative error of the matrix mean %.5f\n", round, rel);
    EXPECT_LT(rel, 0.03) << "GIFT's round trip in the exchange, round " << round;
    EXPECT_GT(rel, 0.0) << "the codec did not run";
    failed += rel >= 0.03 || rel == 0.0;
  }
  EXPECT_EQ(max_rel(gs, ga), 0.0) << "overlapped GIFT exchanges differ from synchronous ones";
  failed += max_rel(gs, ga) != 0.0;
  // The transform is active (the state's geometry says so) and survives state()/load().
  auto st = g_sync->state();
  bool active = false, has_gift = false;
  for (auto& [name, t] : st)
    if (name == "pg.gift") {
      has_gift = true;
      const int64_t* p = t.data<int64_t>();
      double flag;
      std::memcpy(&flag, p + 1 + 4 + 4, 8);  // [matrices | offset rows cols len | rows cols k seen active ...]
      active = p[0] == 1 && flag != 0;
      double aniso;
      std::memcpy(&aniso, p + 1 + 4 + 5, 8);
      if (me == 0) std::printf("gift state: %lld matrices, active %g, anisotropy %g\n", (long long)p[0], flag, aniso);
    }
  EXPECT_TRUE(has_gift) << "no GIFT geometry in the exchange's state";
  EXPECT_TRUE(active) << "GIFT's transform never became active on a rank-2 matrix";
  failed += !active;
  auto resumed = make(kg, true, comm);
  resumed->load(st, "test state");
  Tensor a = Tensor::from_vector(gift_input(me, 3), {n}), b = a.clone();
  g_sync->start(a, comm, "pg", mats)();
  resumed->start(b, comm, "pg", {})();  // the matrices come from the state
  EXPECT_EQ(max_rel(a.to_vector(), b.to_vector()), 0.0) << "GIFT's exchange after state()/load() differs";
  failed += max_rel(a.to_vector(), b.to_vector()) != 0.0;
  write_floats(out + ".gift." + std::to_string(me), ga);
  return failed;
}

}  // namespace

TEST(IslandExchange, RankProgram) {
  const char* tag = std::getenv("ATOLL_EXCHANGE_JOB");
  if (!tag) {  // one rank: the [lowcomm] keys' defaults and refusals
    Config a = Config::parse("[lowcomm]\nexchange = \"nvfp4\"\n", "a.toml");
    comm::CodecSpec s = lowcomm::exchange_spec(a);
    EXPECT_TRUE(s.error_feedback && s.stochastic) << s.describe();
    Config b = Config::parse("[lowcomm]\nexchange = \"int8\"\n", "b.toml");
    s = lowcomm::exchange_spec(b);
    EXPECT_TRUE(s.error_feedback && !s.stochastic) << s.describe();
    Config c = Config::parse("[lowcomm]\nerror_feedback = true\n", "c.toml");
    try {
      lowcomm::exchange_spec(c);
      ADD_FAILURE() << "error feedback with fp32 accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("c.toml:2"), std::string::npos) << e.what();
    }
    for (const char* n : {"fp32", "int8", "fp8_e4m3", "fp8_e5m2", "nvfp4"})
      EXPECT_TRUE(lowcomm::exchange_registry().has(n)) << n;
    for (const char* n : {"gift_fp8", "gift_e5m2", "gift_int8", "gift_nvfp4"})
      EXPECT_TRUE(lowcomm::exchange_registry().has(n)) << n;
    Config d = Config::parse("[lowcomm]\nexchange = \"gift_nvfp4\"\ngift_rank = 2\n", "d.toml");
    s = lowcomm::exchange_spec(d);
    EXPECT_TRUE(s.stochastic && s.gift.rank == 2) << s.describe();
    return;
  }
  set_num_threads(1);
  auto c = comm::make_communicator("gloo", std::chrono::milliseconds(20000));
  if (std::getenv("ATOLL_EXCHANGE_OVERLAP")) check_overlap(c.get(), tag);
  else check_exchanges(c.get(), tag);
}

TEST(IslandExchange, CodecMeansAreWithinTheFormatsBoundAndEqualOnEveryRank) {
  for (int world : {2, 4}) {
    std::string tag = fmt::format("/tmp/atoll_isx_{}_{}", getpid(), world);
    std::vector<int> codes =
        run_rank_programs(world, "IslandExchange.RankProgram", {"ATOLL_EXCHANGE_JOB=" + tag}, tag, 60);
    std::vector<std::string> kinds;
    for (const Case& k : kCases) {
      kinds.push_back(k.codec);
      kinds.push_back(std::string(k.codec) + "_ef");
    }
    auto res = collect_kinds(tag, codes, kinds, fmt::format("codec exchanges on {} ranks", world));
    EXPECT_EQ(res.size(), kinds.size()) << "every rank must succeed and agree bitwise";
  }
}

TEST(IslandExchange, EncodedExchangesOverlapAndGiveTheSynchronousBitsWithGiftToo) {
  std::string tag = fmt::format("/tmp/atoll_isxo_{}", getpid());
  std::vector<int> codes = run_rank_programs(2, "IslandExchange.RankProgram",
                                             {"ATOLL_EXCHANGE_JOB=" + tag, "ATOLL_EXCHANGE_OVERLAP=1"}, tag, 60);
  auto res = collect_kinds(tag, codes, {"overlap", "gift"}, "overlapped codec exchanges on 2 ranks");
  EXPECT_EQ(res.size(), 2u) << "every rank must succeed and agree bitwise";
}
