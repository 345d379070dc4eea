// Gradient codecs: low-precision wire formats for gradient and pseudo-gradient exchange (DDP,
// DiLoCo). A codec turns n f32 values into a fixed number of bytes (values plus their scales) and
// back; the size depends on n only, so every rank's encoded chunk has the same length and the
// encoded chunks can travel through all_to_all / all_gather unchanged. Codecs are stateless and
// register by name (one file each: codec_int8.cpp, codec_fp8.cpp, codec_nvfp4.cpp); the stateful
// parts of a compressed exchange — error feedback (error_feedback.h) and GIFT's geometry
// (codec_gift.h) — live in CompressedAllReducer (compressed_allreduce.h).
//
// Inputs must be finite: a NaN or infinity is refused with the element's index (a quantizer has no
// faithful code for it, and silently zeroing it would hide a diverging run). Values beyond a
// format's range cannot occur after block scaling except by rounding, and saturate to the largest
// finite code (never to NaN or infinity).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/codec_gift.h"
#include "core/config.h"
#include "core/registry.h"

namespace atl::comm {

// A counter-based random stream for stochastic rounding: value i of a call is a pure function of
// (seed, i), so encoding is reproducible and may run in parallel.
struct RoundingRng {
  uint64_t seed = 0;
  // Uniform in [0, 1) with 24 random bits (enough for a float comparison).
  float uniform(uint64_t i) const;
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual std::string name() const = 0;
  // Bytes encode() writes for n values (values and scales together).
  virtual int64_t encoded_bytes(int64_t n) const = 0;
  // rng null: round to nearest (ties to even); otherwise stochastic rounding from rng.
  virtual void encode(const float* x, int64_t n, uint8_t* out, const RoundingRng* rng) const = 0;
  virtual void decode(const uint8_t* in, int64_t n, float* out) const = 0;
};

// A registered codec: how to build it, and the transform it is wrapped in (GIFT: "gift").
struct CodecEntry {
  std::function<std::unique_ptr<Codec>()> make;
  std::string transform;  // "" (none) or "gift"
  std::string base;       // the wire codec under the transform (its registry name)
};
// Names: int8, fp8_e4m3, fp8_e5m2, nvfp4, gift_fp8 (= GIFT + fp8_e4m3), gift_e5m2, gift_int8,
// gift_nvfp4. "none" is not a codec: it means f32 and the communicator's own all_reduce.
Registry<CodecEntry>& codec_registry();
struct CodecRegistrar {
  CodecRegistrar(const std::string& name, CodecEntry e) { codec_registry().add(name, std::move(e)); }
};
std::unique_ptr<Codec> make_codec(const std::string& name, const std::string& key = "");

// How a compressed exchange is configured ([parallel] codec, error_feedback, codec_rounding,
// codec_seed for DDP; DiLoCo reads the same keys under its own section).
struct CodecSpec {
  std::string codec = "none";
  bool error_feedback = false;
  bool stochastic = false;   // codec_rounding = "stochastic"
  uint64_t seed = 0;         // of the stochastic rounding (mixed with the rank and the call)
  bool gather_encoded = true;  // the all-gather phase re-encodes the reduced chunk (else f32)
  GiftOptions gift;            // gift_rank, gift_max_shrink, gift_min_anisotropy, gift_beta
  std::string where;         // where codec was set, for messages ("file:line")
  bool none() const { return codec == "none"; }
  // One line that ranks compare at setup (exchange_codec_spec): equal specs, equal lines.
  std::string describe() const;
  // Reads section.codec, .error_feedback, .codec_rounding, .codec_seed, .codec_gather and the
  // gift_* keys. The codec name is not
  // checked here: ranks first compare their specs (a name unknown to one rank is reported by all
  // of them), then look the name up.
  static CodecSpec from_config(Config& cfg, const std::string& section);
};

// ---- scalar formats, shared by the codecs (codec_fp8.cpp) ----
namespace fp8 {
constexpr float kE4M3Max = 448.f, kE5M2Max = 57344.f;
// Round (nearest-even, or stochastic with u in [0,1)) to the format and return its 8-bit code;
// beyond the largest finite value saturates. u < 0: nearest.
uint8_t encode_e4m3(float x, float u = -1.f);
uint8_t encode_e5m2(float x, float u = -1.f);
float decode_e4m3(uint8_t c);
float decode_e5m2(uint8_t c);
// The smallest E4M3 value >= x (x >= 0), for scales that must not shrink.
uint8_t encode_e4m3_up(float x);
}  // namespace fp8

// Throws naming the first non-finite element of x[0, n) (offset added to the index).
void check_finite(const float* x, int64_t n, int64_t offset = 0);

}  // namespace atl::comm
