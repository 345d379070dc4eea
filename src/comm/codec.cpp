// The codec registry and the configuration every compressed exchange shares; see codec.h.
#include "comm/codec.h"

#include <fmt/format.h>

#include <cmath>

namespace atl::comm {

float RoundingRng::uniform(uint64_t i) const {
  uint64_t x = seed ^ (i * 0x9e3779b97f4a7c15ull);  // splitmix64 of (seed, i)
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return float(x >> 40) * (1.f / 16777216.f);
}

Registry<CodecEntry>& codec_registry() {
  static Registry<CodecEntry> r("codec");
  return r;
}

std::unique_ptr<Codec> make_codec(const std::string& name, const std::string& key) {
  const CodecEntry& e = codec_registry().get(name, key);
  if (!e.base.empty() && e.base != name) return make_codec(e.base, key);
  return e.make();
}

std::string CodecSpec::describe() const {
  std::string g = codec.rfind("gift", 0) == 0 ? fmt::format(" gift=k{},shrink{},aniso{},beta{}", gift.rank, gift.max_shrink,
                                                          gift.min_anisotropy, gift.beta)
                                              : "";
  return fmt::format("codec={} error_feedback={} rounding={} seed={} gather={}{}", codec, error_feedback,
                     stochastic ? "stochastic" : "nearest", seed, gather_encoded ? "encoded" : "f32", g);
}

CodecSpec CodecSpec::from_config(Config& cfg, const std::string& section) {
  CodecSpec s;
  s.codec = cfg.get_string(section + ".codec", s.codec);
  s.where = cfg.where(section + ".codec");
  s.error_feedback = cfg.get_bool(section + ".error_feedback", s.error_feedback);
  s.stochastic = cfg.get_string(section + ".codec_rounding", "nearest", {"nearest", "stochastic"}) == "stochastic";
  s.seed = uint64_t(cfg.get_int(section + ".codec_seed", 0, 0, INT64_MAX));
  s.gather_encoded = cfg.get_string(section + ".codec_gather", "encoded", {"encoded", "f32"}) == "encoded";
  s.gift.rank = int(cfg.get_int(section + ".gift_rank", s.gift.rank, 1, 64));
  s.gift.max_shrink = cfg.get_float(section + ".gift_max_shrink", s.gift.max_shrink, 1.0, 1e4);
  s.gift.min_anisotropy = cfg.get_float(section + ".gift_min_anisotropy", s.gift.min_anisotropy, 1.0, 1e6);
  s.gift.beta = cfg.get_float(section + ".gift_beta", s.gift.beta, 0.0, 0.999);
  std::string ef_where = cfg.where(section + ".error_feedback");
  ATOLL_CHECK(!s.none() || !s.error_feedback, "{}.error_feedback = true{} needs a codec ({}.codec is 'none')", section,
              ef_where.empty() ? "" : " (" + ef_where + ")", section);
  return s;
}

void check_finite(const float* x, int64_t n, int64_t offset) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      fail("codec: element {} is {}; a compressed exchange takes finite values only (a diverged step?)", offset + i,
           x[i]);
}

}  // namespace atl::comm
