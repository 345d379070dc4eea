// The gradient codecs (comm/codec.h) one process at a time: every format's round-trip error
// within its bound on random and adversarial inputs, correct rounding and saturation of the FP8
// scalars, unbiased stochastic rounding, error feedback's bounded accumulated error, and GIFT's
// transform inverting to fp32 rounding. The bounds are the formats' own (derived in each test from
// the input alone, never from the codec's output), so they hold on any CPU: the codecs use no
// fused or vectorised arithmetic whose rounding could vary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "comm/codec.h"
#include "comm/codec_gift.h"
#include "comm/compressed_allreduce.h"

using namespace atl;
using namespace atl::comm;

namespace {

constexpr float kTiny = std::numeric_limits<float>::min();

std::vector<float> round_trip(const Codec& c, const std::vector<float>& x, const RoundingRng* rng = nullptr) {
  std::vector<uint8_t> buf(size_t(c.encoded_bytes(int64_t(x.size()))));
  c.encode(x.data(), int64_t(x.size()), buf.data(), rng);
  std::vector<float> y(x.size());
  c.decode(buf.data(), int64_t(x.size()), y.data());
  return y;
}

int64_t block_of(const std::string& codec) { return codec == "nvfp4" ? 16 : 32; }

// The largest error the format allows for element i of x (round to nearest):
//  int8:  s / 2, s = max(block max / 127, FLT_MIN);
//  fp8:   max(2^-(m+1) |x|, s 2^(emin-m-1)), s = max(block max / fmax, FLT_MIN): half a step in the
//         normal range (relative 2^-4 for E4M3, 2^-3 for E5M2), half the subnormal step below;
//  nvfp4: max(|x| / 4, S / 4), S <= block max / 6 (1 + 2^-3) + s_t 2^-9 (the E4M3 block scale,
//         rounded up by at most one E4M3 step; s_t = max / (6 * 448) the tensor scale).
// Plus 2^-21 of the block max for the f32 divisions and products around the rounding.
std::vector<double> bounds(const std::string& codec, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size()), B = block_of(codec);
  double tmax = 0;
  for (float v : x) tmax = std::max(tmax, double(std::fabs(v)));
  std::vector<double> out(x.size());
  for (int64_t b = 0; b < n; b += B) {
    double amax = 0;
    for (int64_t i = b; i < std::min(n, b + B); ++i) amax = std::max(amax, double(std::fabs(x[size_t(i)])));
    for (int64_t i = b; i < std::min(n, b + B); ++i) {
      double a = std::fabs(double(x[size_t(i)])), e;
      if (codec == "int8") {
        e = std::max(amax / 127, double(kTiny)) / 2;
      } else if (codec == "fp8_e4m3" || codec == "fp8_e5m2") {
        bool e4 = codec == "fp8_e4m3";
        int m = e4 ? 3 : 2, emin = e4 ? -6 : -14;
        double s = std::max(amax / (e4 ? 448.0 : 57344.0), double(kTiny));
        e = std::max(std::ldexp(a, -(m + 1)), s * std::ldexp(1.0, emin - m - 1));
      } else {
        double st = std::max(tmax / (6 * 448.0), double(kTiny));
        double S = amax / 6 * (1 + 0.125) + st * std::ldexp(1.0, -9);
        e = std::max(a / 4, S / 4);
      }
      out[size_t(i)] = e + amax * std::ldexp(1.0, -21);
    }
  }
  return out;
}

std::vector<float> randn(size_t n, float scale, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Inputs that stress scaling: zeros, huge, denormal, a giant beside tiny ones in one block, a
// partial last block, a single value, exact grid points and ties.
std::vector<std::pair<std::string, std::vector<float>>> inputs() {
  std::vector<std::pair<std::string, std::vector<float>>> v;
  v.push_back({"randn", randn(1000, 1.f, 1)});
  v.push_back({"randn_small", randn(333, 1e-6f, 2)});
  v.push_back({"zeros", std::vector<float>(70, 0.f)});
  v.push_back({"one", {-3.25f}});
  std::vector<float> huge = randn(96, 1e37f, 3);
  huge[5] = std::numeric_limits<float>::max();
  huge[40] = -std::numeric_limits<float>::max();
  v.push_back({"huge", huge});
  std::vector<float> den(64);
  for (size_t i = 0; i < den.size(); ++i) den[i] = float(int(i) - 30) * std::numeric_limits<float>::denorm_min() * 3;
  v.push_back({"denormal", den});
  std::vector<float> mixed = randn(128, 1e-4f, 4);
  for (size_t i = 0; i < mixed.size(); i += 16) mixed[i] = 1e4f;  // one giant per block
  mixed[77] = 0.f;
  v.push_back({"giant_beside_tiny", mixed});
  std::vector<float> blocks(160);  // blocks 1e-30 .. 1e30 apart: NVFP4's tensor scale at its limit
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = float(std::pow(10.0, double(i / 16) * 6 - 30)) * (i % 3 ? 1.f : -0.7f);
  v.push_back({"blocks_far_apart", blocks});
  std::vector<float> ties;
  for (int i = -24; i <= 24; ++i) ties.push_back(float(i) * 0.25f);  // E2M1 / FP8 grid points and midpoints
  v.push_back({"grid_and_ties", ties});
  return v;
}

const char* kCodecs[] = {"int8", "fp8_e4m3", "fp8_e5m2", "nvfp4"};

}  // namespace

TEST(Codecs, RoundTripWithinTheFormatsBound) {
  for (const char* name : kCodecs) {
    auto codec = make_codec(name);
    for (auto& [what, x] : inputs()) {
      std::vector<float> y = round_trip(*codec, x);
      std::vector<double> bd = bounds(name, x);
      int bad = 0;
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << name << " " << what << " element " << i << " decoded to " << y[i];
        double err = std::fabs(double(y[i]) - double(x[i]));
        worst = std::max(worst, err / bd[i]);
        if (err > bd[i] && bad++ < 3) {
          ADD_FAILURE() << name << " " << what << " element " << i << ": " << x[i] << " -> " << y[i] << ", error "
                        << err << " > bound " << bd[i];
        }
        if (x[i] == 0.f) {
          EXPECT_EQ(y[i], 0.f) << name << " " << what << ": zero must stay exact";
        }
      }
      // The bound is the format's, not a loose one: random inputs come close to it.
      if (what == "randn") {
        EXPECT_GT(worst, 0.6) << name << ": no element comes near the bound";
      }
    }
  }
}

TEST(Codecs, EncodedSizesAreTheFormats) {
  // f32 is 4 bytes a value: int8/fp8 1 + 4/32, NVFP4 1/2 + 1/16 (+ 4 per tensor).
  EXPECT_EQ(make_codec("int8")->encoded_bytes(1024), 1024 + 128);
  EXPECT_EQ(make_codec("fp8_e4m3")->encoded_bytes(1000), 1000 + 4 * 32);
  EXPECT_EQ(make_codec("nvfp4")->encoded_bytes(1024), 4 + 64 + 512);
  EXPECT_NEAR(4.0 * 1e6 / double(make_codec("nvfp4")->encoded_bytes(1000000)), 7.1, 0.02);
}

TEST(Codecs, Fp8ScalarsRoundCorrectlyAndSaturate) {
  // Correct rounding: the code is the nearest of all 254 finite codes (ties to the even code),
  // checked by brute force over values spread across both formats' ranges.
  std::mt19937 g(5);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  for (bool e4 : {true, false}) {
    const float fmax = e4 ? fp8::kE4M3Max : fp8::kE5M2Max;
    auto enc = e4 ? [](float v) { return fp8::encode_e4m3(v); } : [](float v) { return fp8::encode_e5m2(v); };
    auto dec = e4 ? fp8::decode_e4m3 : fp8::decode_e5m2;
    for (int t = 0; t < 20000; ++t) {
      float x = std::ldexp(mant(g), int(g() % 40) - (e4 ? 12 : 20));
      if (t < 256) {
        x = dec(uint8_t(t)) * (t % 2 ? 1.f : 1.0625f);  // exact codes and between them
      }
      if (!std::isfinite(x)) continue;
      float got = dec(enc(x));
      double best = INFINITY;
      for (int c = 0; c < 256; ++c) {
        float v = dec(uint8_t(c));
        if (std::isfinite(v)) best = std::min(best, std::fabs(double(v) - double(x)));
      }
      double want = std::fabs(x) > fmax ? std::fabs(x) - fmax : best;
      ASSERT_EQ(std::fabs(double(got) - double(x)), want) << (e4 ? "E4M3 " : "E5M2 ") << x << " -> " << got;
    }
    // Ties go to the even mantissa: 1 + half a step (E4M3 step 1/8, E5M2 1/4 at 1) rounds to 1.
    EXPECT_EQ(dec(enc(1.f + (e4 ? 0.0625f : 0.125f))), 1.f);
    EXPECT_EQ(dec(enc(1.f + (e4 ? 3 * 0.0625f : 3 * 0.125f))), 1.f + (e4 ? 0.25f : 0.5f));
    // Saturation, never NaN or infinity.
    for (float big : {fmax * 1.01f, 1e30f, std::numeric_limits<float>::max()}) {
      EXPECT_EQ(dec(enc(big)), fmax);
      EXPECT_EQ(dec(enc(-big)), -fmax);
    }
  }
  EXPECT_EQ(fp8::encode_e4m3(448.f), 0x7e);  // S.1111.110: 1111.111 is E4M3's NaN
  EXPECT_EQ(fp8::encode_e5m2(57344.f), 0x7b);
  EXPECT_GE(fp8::decode_e4m3(fp8::encode_e4m3_up(0.3f)), 0.3f);
  EXPECT_EQ(fp8::decode_e4m3(fp8::encode_e4m3_up(1e-7f)), std::ldexp(1.f, -9));  // the smallest subnormal
}

TEST(Codecs, NonFiniteInputIsRefusedWithItsIndex) {
  for (const char* name : kCodecs) {
    auto codec = make_codec(name);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
      std::vector<float> x(50, 1.f);
      x[37] = bad;
      std::vector<uint8_t> buf(size_t(codec->encoded_bytes(50)));
      try {
        codec->encode(x.data(), 50, buf.data(), nullptr);
        ADD_FAILURE() << name << " accepted " << bad;
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("element 37"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Codecs, UnknownCodecNamesTheValidOnes) {
  try {
    make_codec("int9", "parallel.codec");
    ADD_FAILURE() << "int9 accepted";
  } catch (const std::exception& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("parallel.codec"), std::string::npos) << m;
    EXPECT_NE(m.find("int8"), std::string::npos) << m;
  }
}

// Stochastic rounding is unbiased: over M draws the mean of the decoded value approaches x. A
// draw lands on one of the two grid points around x, so its standard deviation is at most half
// their spacing h <= 2 b (b the nearest-rounding bound): the mean's error stays within
// 5 h / (2 sqrt M) <= 5 b / sqrt M except with probability < 1e-6 per value (and the seeds are
// fixed, so the outcome is too). Nearest rounding of the same values misses by more, which shows
// the bound can fail.
TEST(Codecs, StochasticRoundingIsUnbiased) {
  const int M = 4000;
  for (const char* name : kCodecs) {
    auto codec = make_codec(name);
    std::vector<float> x = randn(32, 1.f, 9);
    x[3] = 7.5f;  // the block maximum, so the others fall between grid points
    std::vector<double> bd = bounds(name, x), mean(x.size(), 0.0);
    for (int d = 0; d < M; ++d) {
      RoundingRng rng{uint64_t(d) * 7919 + 13};
      std::vector<float> y = round_trip(*codec, x, &rng);
      for (size_t i = 0; i < x.size(); ++i) mean[i] += double(y[i]) / M;
    }
    std::vector<float> nearest = round_trip(*codec, x);
    double worst_nearest = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      double lim = 5 * bd[i] / std::sqrt(double(M));
      EXPECT_LE(std::fabs(mean[i] - x[i]), lim) << name << " element " << i << " x=" << x[i] << " mean=" << mean[i];
      worst_nearest = std::max(worst_nearest, std::fabs(double(nearest[i]) - x[i]) / lim);
    }
    EXPECT_GT(worst_nearest, 1.0) << name << ": nearest rounding already meets the bound, so it tests nothing";
  }
}

// Error feedback: the residual of each round is added to the next one's input, so the sum of
// what was sent trails the sum of the inputs by only the last residual — at most one round's
// error, here of two encodes (the local one and the owner's re-encode), each within its bound
// for values up to twice the input's magnitude. Without it a constant input repeats the same
// rounding error every round and the gap grows a hundredfold.
TEST(Codecs, ErrorFeedbackKeepsTheAccumulatedErrorBounded) {
  auto single = make_single_communicator(std::chrono::milliseconds(5000));
  const int rounds = 100;
  for (const char* name : kCodecs) {
    std::vector<float> x = randn(256, 1.f, 11);
    double bound = 0;
    {
      std::vector<float> x2(x);
      for (auto& v : x2) v *= 2;
      for (double b : bounds(name, x2)) bound = std::max(bound, b);
    }
    double gap[2];
    for (int ef = 0; ef < 2; ++ef) {
      CodecSpec spec;
      spec.codec = name;
      spec.error_feedback = ef == 1;
      CompressedAllReducer r(single.get(), spec);
      std::vector<double> sent(x.size(), 0.0);
      for (int t = 0; t < rounds; ++t) {
        Tensor v = Tensor::from_vector(x, {int64_t(x.size())});
        r.all_reduce(v, ReduceOp::sum, "g");
        for (size_t i = 0; i < x.size(); ++i) sent[i] += v.f32()[i];
      }
      gap[ef] = 0;
      for (size_t i = 0; i < x.size(); ++i) gap[ef] = std::max(gap[ef], std::fabs(sent[i] - rounds * double(x[i])));
    }
    EXPECT_LE(gap[1], 2 * bound * 1.01) << name << " with error feedback";
    EXPECT_GT(gap[0], 20 * gap[1]) << name << ": without error feedback the error should accumulate";
  }
}

// GIFT: T then T^-1 gives the matrix back to fp32 rounding. The forward result is rounded once to
// f32 (relative 2^-24 of G T, and ||G T|| <= ||G|| since T only shrinks), T^-1 amplifies that by
// at most kappa = max 1/d_i, and the result is rounded once more: (kappa + 1) 2^-24 ||G||_F, with
// Q orthonormal to double precision (its error, ~1e-16, is far below).
TEST(Codecs, GiftTransformInvertsToFp32RoundingAndFlattensTheSpectrum) {
  const int64_t R = 96, C = 128;
  std::mt19937 g(3);
  std::normal_distribution<double> nd;
  std::vector<float> G(size_t(R * C));
  std::vector<double> u(size_t(4 * R)), v(size_t(4 * C));
  for (auto& a : u) a = nd(g);
  for (auto& a : v) a = nd(g);
  const double sig[4] = {60, 30, 15, 8};
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) {
      double s = 0.3 * nd(g);
      for (int k = 0; k < 4; ++k) s += sig[k] * u[size_t(k * R + i)] * v[size_t(k * C + j)] / std::sqrt(double(R * C));
      G[size_t(i * C + j)] = float(s);
    }
  GiftTransform T(R, C);
  EXPECT_FALSE(T.active());
  for (int it = 0; it < 6; ++it) T.observe(G.data());  // converging subspace iteration
  ASSERT_TRUE(T.active()) << "anisotropy " << T.anisotropy();
  std::vector<float> y = G;
  T.forward(y.data());
  double moved = 0, norm = 0;
  for (size_t i = 0; i < G.size(); ++i) {
    moved += (double(y[i]) - G[i]) * (double(y[i]) - G[i]);
    norm += double(G[i]) * G[i];
  }
  EXPECT_GT(std::sqrt(moved / norm), 0.1) << "the transform should change an anisotropic matrix";
  GiftTransform after(R, C);
  for (int it = 0; it < 6; ++it) after.observe(y.data());
  EXPECT_LT(after.anisotropy(), T.anisotropy() / 3) << "G T should be nearer isotropic than G";
  T.inverse(y.data());
  double err = 0;
  for (size_t i = 0; i < G.size(); ++i) err += (double(y[i]) - G[i]) * (double(y[i]) - G[i]);
  EXPECT_LE(std::sqrt(err), (T.max_ratio() + 1) * std::ldexp(1.0, -24) * std::sqrt(norm))
      << "kappa " << T.max_ratio();
  // Isotropic noise is left alone (it does not pay).
  std::vector<float> noise = randn(size_t(R * C), 1.f, 8);
  GiftTransform N(R, C);
  for (int it = 0; it < 6; ++it) N.observe(noise.data());
  EXPECT_FALSE(N.active()) << "anisotropy " << N.anisotropy();
}
