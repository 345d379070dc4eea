// How a pseudo-gradient travels between islands: the hook a codec plugs into. An exchange
// averages a contiguous f32 tensor in place over the communicator that joins equal ranks of
// different islands; start() issues it and returns what completes it, so Streaming DiLoCo can
// overlap the transfer with inner steps. "fp32" (the default) is a plain all-reduce; a codec
// (src/comm/codec_*) registers another name here that encodes before and decodes after, and
// must not accumulate in its low precision. Chosen by [lowcomm] exchange.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/registry.h"

namespace atl::lowcomm {

class PseudoGradientExchange {
 public:
  virtual ~PseudoGradientExchange() = default;
  virtual std::string name() const = 0;
  // Starts averaging t (contiguous f32) in place over `across` (null or one rank: nothing to do).
  // t must stay untouched until the returned function has run; it blocks until t holds the mean.
  virtual std::function<void()> start(const Tensor& t, comm::Communicator* across) = 0;
  // Bytes this rank sends for one exchange of `numel` elements over `ranks` ranks (atoll's count,
  // compared with the veth counters by the WAN test bed).
  virtual int64_t wire_bytes(int64_t numel, int ranks) const = 0;
};

using ExchangeMaker = std::function<std::unique_ptr<PseudoGradientExchange>(Config& cfg)>;
Registry<ExchangeMaker>& exchange_registry();

// Ring all-reduce's traffic per rank: 2 (p - 1) / p of the buffer.
int64_t ring_all_reduce_bytes(int64_t bytes, int ranks);

}  // namespace atl::lowcomm
