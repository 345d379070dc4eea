// The fp32 pseudo-gradient exchange, the exchange registry and its config; see exchange.h.
#include "lowcomm/exchange.h"

#include <fmt/format.h>

namespace atl::lowcomm {

int64_t ring_all_reduce_bytes(int64_t bytes, int ranks) {
  return ranks <= 1 ? 0 : 2 * (ranks - 1) * bytes / ranks;
}

namespace {
class Fp32Exchange final : public PseudoGradientExchange {
 public:
  std::string name() const override { return "fp32"; }
  std::function<void()> start(const Tensor& t, comm::Communicator* across, const std::string&,
                              const std::vector<comm::MatrixSpan>&) override {
    if (!across || across->size() == 1) return [] {};
    comm::WorkPtr w = across->all_reduce_async(t, comm::ReduceOp::avg);
    return [w] { w->wait(); };
  }
  int64_t wire_bytes(int64_t numel, int ranks) const override {
    return ring_all_reduce_bytes(numel * int64_t(sizeof(float)), ranks);
  }
};
}  // namespace

Registry<ExchangeMaker>& exchange_registry() {
  static Registry<ExchangeMaker> r = [] {
    Registry<ExchangeMaker> g("pseudo-gradient exchange");
    g.add("fp32", [](const comm::CodecSpec&) { return std::make_unique<Fp32Exchange>(); });
    register_codec_exchanges(g);
    return g;
  }();
  return r;
}

std::string describe_exchange(const comm::CodecSpec& s) {
  if (s.none()) return "fp32";
  return fmt::format("{} ({}error feedback, {} rounding{})", s.codec, s.error_feedback ? "" : "no ",
                     s.stochastic ? "stochastic" : "nearest", s.gather_encoded ? "" : ", f32 gather");
}

comm::CodecSpec exchange_spec(Config& cfg) {
  comm::CodecSpec s;
  std::string name = cfg.get_string("lowcomm.exchange", "fp32");
  s.codec = name == "fp32" ? "none" : name;
  s.where = cfg.where("lowcomm.exchange");
  s.error_feedback = cfg.get_bool("lowcomm.error_feedback", !s.none());
  s.stochastic = cfg.get_string("lowcomm.codec_rounding",
                                name == "nvfp4" || name == "gift_nvfp4" ? "stochastic" : "nearest",
                                {"nearest", "stochastic"}) == "stochastic";
  s.seed = uint64_t(cfg.get_int("lowcomm.codec_seed", 0, 0, INT64_MAX));
  s.gather_encoded = cfg.get_string("lowcomm.codec_gather", "encoded", {"encoded", "f32"}) == "encoded";
  if (name.rfind("gift", 0) == 0) {  // GIFT's options (comm/codec_gift.h), only with its codecs
    s.gift.rank = int(cfg.get_int("lowcomm.gift_rank", s.gift.rank, 1, 64));
    s.gift.max_shrink = cfg.get_float("lowcomm.gift_max_shrink", s.gift.max_shrink, 1.0, 1e4);
    s.gift.min_anisotropy = cfg.get_float("lowcomm.gift_min_anisotropy", s.gift.min_anisotropy, 1.0, 1e6);
    s.gift.beta = cfg.get_float("lowcomm.gift_beta", s.gift.beta, 0.0, 0.999);
  }
  ATOLL_CHECK(!s.none() || !s.error_feedback, "lowcomm.error_feedback = true ({}) needs a codec exchange "
              "(lowcomm.exchange is 'fp32')", cfg.where("lowcomm.error_feedback"));
  ATOLL_CHECK(!s.none() || !s.stochastic, "lowcomm.codec_rounding = 'stochastic' ({}) needs a codec exchange "
              "(lowcomm.exchange is 'fp32')", cfg.where("lowcomm.codec_rounding"));
  return s;
}

}  // namespace atl::lowcomm
