// Pseudo-gradient exchanges through a gradient codec (issue 13 item 6 for DiLoCo / Streaming
// DiLoCo): int8, fp8_e4m3, fp8_e5m2, nvfp4, and GIFT's gift_fp8, gift_e5m2, gift_int8, gift_nvfp4
// (comm/codec_*; GIFT transforms each whole matrix of the exchanged tensor, the caller's mats). The tensor is averaged by a
// comm::CompressedAllReducer over the islands: encoded (after this rank's error-feedback
// residual is added), reduce-scattered, decoded and summed IN F32, re-encoded and all-gathered,
// so every island decodes the same bits and the islands stay bitwise equal after the outer step.
// Error feedback is this rank's own (each rank sends its share of its island's pseudo-gradient),
// kept per key (one per Streaming fragment) and saved in checkpoints with the rounding counters
// and GIFT's geometry.
//
// start() queues the whole exchange on the communicator's worker and returns at once
// (CompressedAllReducer::start_all_reduce): encode, all-to-all, sum, re-encode, all-gather and
// decode overlap Streaming DiLoCo's next tau inner steps, as the fp32 all-reduce does, with the
// bits of the synchronous path.
#include <fmt/format.h>

#include "comm/compressed_allreduce.h"
#include "lowcomm/exchange.h"

namespace atl::lowcomm {

namespace {
class CodecExchange final : public PseudoGradientExchange {
 public:
  explicit CodecExchange(comm::CodecSpec spec) : spec_(std::move(spec)), codec_(comm::make_codec(spec_.codec)) {}
  std::string name() const override { return spec_.codec; }
  void setup(comm::Communicator* across) override {
    // The ranks agreed on the spec over the whole job before this (LowComm's constructor).
    reducer_ = std::make_unique<comm::CompressedAllReducer>(across, spec_, /*exchange=*/false);
  }
  std::function<void()> start(const Tensor& t, comm::Communicator* across, const std::string& key,
                              const std::vector<comm::MatrixSpan>& mats) override {
    if (!across || across->size() == 1) return [] {};
    ATOLL_CHECK(reducer_, "lowcomm exchange {}: start before setup", spec_.codec);
    return reducer_->start_all_reduce(t, comm::ReduceOp::avg, key, mats);
  }
  int64_t wire_bytes(int64_t numel, int ranks) const override {
    if (ranks <= 1) return 0;
    // CompressedAllReducer's traffic: W - 1 encoded chunks out in the all-to-all, and this
    // rank's reduced chunk to W - 1 peers in the all-gather.
    const int64_t c = (numel + ranks - 1) / ranks, words = (codec_->encoded_bytes(c) + 3) / 4;
    return int64_t(ranks - 1) * (words * 4 + (spec_.gather_encoded ? words * 4 : c * 4));
  }
  std::vector<std::pair<std::string, Tensor>> state() const override {
    return reducer_ ? reducer_->state_tensors() : std::vector<std::pair<std::string, Tensor>>{};
  }
  void load(const std::vector<std::pair<std::string, Tensor>>& sd, const std::string& what) override {
    ATOLL_CHECK(reducer_, "lowcomm exchange {}: load before setup", spec_.codec);
    reducer_->load_state_tensors(sd, what);
  }

 private:
  comm::CodecSpec spec_;
  std::unique_ptr<comm::Codec> codec_;
  std::unique_ptr<comm::CompressedAllReducer> reducer_;
};
}  // namespace

void register_codec_exchanges(Registry<ExchangeMaker>& r) {
  for (const char* name : {"int8", "fp8_e4m3", "fp8_e5m2", "nvfp4", "gift_fp8", "gift_e5m2", "gift_int8", "gift_nvfp4"})
    r.add(name, [](const comm::CodecSpec& s) { return std::make_unique<CodecExchange>(s); });
}

}  // namespace atl::lowcomm
