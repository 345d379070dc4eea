// How a pseudo-gradient travels between islands: the hook a codec plugs into. An exchange
// averages a contiguous f32 tensor in place over the communicator that joins equal ranks of
// different islands; start() issues it and returns what completes it, so Streaming DiLoCo can
// overlap the transfer with inner steps. "fp32" (the default) is a plain all-reduce; the codecs
// of src/comm/codec_* (int8, fp8_e4m3, fp8_e5m2, nvfp4 and GIFT's gift_fp8, gift_e5m2, gift_int8,
// gift_nvfp4: exchange_codec.cpp) encode before and decode after, sum in f32
// (comm/compressed_allreduce.h), and keep their error feedback (and GIFT's geometry) per rank (so
// per island), in checkpoints; both kinds are asynchronous. Chosen by [lowcomm] exchange, with
// error_feedback, codec_rounding, codec_seed, codec_gather and gift_* (exchange_spec below).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/codec.h"
#include "comm/compressed_allreduce.h"
#include "comm/communicator.h"
#include "core/config.h"
#include "core/registry.h"

namespace atl::lowcomm {

class PseudoGradientExchange {
 public:
  virtual ~PseudoGradientExchange() = default;
  virtual std::string name() const = 0;
  // Once, on every rank, before any start(), with the communicator start() will get.
  virtual void setup(comm::Communicator* across) {}
  // Starts averaging t (contiguous f32) in place over `across` (null or one rank: nothing to do).
  // t must stay untouched until the returned function has run; it blocks until t holds the mean.
  // key names the tensor (one per Streaming fragment) for a codec's error feedback; mats are the
  // whole matrices inside t (row-major), for GIFT's per-matrix transform (read on a key's first call).
  virtual std::function<void()> start(const Tensor& t, comm::Communicator* across, const std::string& key,
                                      const std::vector<comm::MatrixSpan>& mats = {}) = 0;
  // Bytes this rank sends for one exchange of `numel` elements over `ranks` ranks (atoll's count,
  // compared with the veth counters by the WAN test bed).
  virtual int64_t wire_bytes(int64_t numel, int ranks) const = 0;
  // This rank's state for a bit-exact resume (error-feedback residuals, rounding counters), and
  // its inverse (all exchanges in flight have completed).
  virtual std::vector<std::pair<std::string, Tensor>> state() const { return {}; }
  virtual void load(const std::vector<std::pair<std::string, Tensor>>& sd, const std::string& what) {}
};

using ExchangeMaker = std::function<std::unique_ptr<PseudoGradientExchange>(const comm::CodecSpec& spec)>;
Registry<ExchangeMaker>& exchange_registry();
// exchange_codec.cpp: registers int8, fp8_e4m3, fp8_e5m2, nvfp4 and the gift_* codecs.
void register_codec_exchanges(Registry<ExchangeMaker>& r);

// [lowcomm] exchange and the codec keys, as a spec ("fp32" is codec "none"). The name is not
// checked here: ranks compare specs first (comm::exchange_codec_spec), so a name one rank does
// not know is refused by all of them. Defaults for a codec: error_feedback = true, and
// codec_rounding = "stochastic" for nvfp4 and gift_nvfp4 ("nearest" otherwise); gift_rank,
// gift_max_shrink, gift_min_anisotropy and gift_beta for the gift_* codecs (comm/codec_gift.h).
comm::CodecSpec exchange_spec(Config& cfg);

// "fp32", or e.g. "int8 (error feedback, nearest rounding)": for the methods' describe().
std::string describe_exchange(const comm::CodecSpec& spec);

// Ring all-reduce's traffic per rank: 2 (p - 1) / p of the buffer.
int64_t ring_all_reduce_bytes(int64_t bytes, int ranks);

}  // namespace atl::lowcomm
