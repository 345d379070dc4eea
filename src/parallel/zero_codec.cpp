// ZeRO-1/2 with a gradient codec (issue 13 item 6 for ZeRO): stage 1's all-reduce and stage 2's
// reduce-scatter through comm::CompressedAllReducer, so the reduction of compressed gradients
// accumulates in f32 (each rank's chunk decoded, then summed in rank order), never in the low
// precision. Error feedback is kept per bucket. Stage 3 / HSDP are refused: their reduce-scatters
// run unit by unit with backpressure and replicas, which this path does not follow. GIFT's codecs
// are refused under stage 2 (the reduce-scatter leaves no rank the whole reduced gradient to learn
// GIFT's geometry from) and under stage 1 (not wired to the buckets' matrices).
#include <fmt/format.h>

#include "parallel/zero.h"

namespace atl::parallel {

void Zero::setup_codec(const comm::CodecSpec& codec) {
  const std::string where = codec.where.empty() ? "" : " (" + codec.where + ")";
  ATOLL_CHECK(codec.none() || (stage_ <= 2 && !hsdp_), "parallel.codec = '{}'{}: gradient codecs run under ddp, "
              "zero1 and zero2, not '{}'", codec.codec, where, name());
  if (!shard_ || shard_->size() == 1) {
    if (!codec.none()) comm::make_codec(codec.codec, "parallel.codec" + where);  // a typo is still one
    return;
  }
  // Every rank states its codec (also "none"), so a rank that disagrees is refused now, by all.
  comm::exchange_codec_spec(*shard_, codec, "parallel.codec");
  if (codec.none()) return;
  ATOLL_CHECK(comm::codec_registry().get(codec.codec).transform.empty(),
              "parallel.codec = '{}'{}: GIFT's codecs run under parallel.strategy = 'ddp' only", codec.codec, where);
  compressor_ = std::make_unique<comm::CompressedAllReducer>(shard_, codec, false);
}

std::vector<std::pair<std::string, int64_t>> Zero::gradient_codec_tensors() const {
  std::vector<std::pair<std::string, int64_t>> out;
  if (!compressor_) return out;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {  // what reduce_compressed hands the codec
    const BucketLayout& L = layout_.buckets[b];
    out.emplace_back(fmt::format("bucket{}", b), stage_ == 1 ? L.range.size() : L.chunk * shards());
  }
  return out;
}

bool Zero::reduce_compressed(size_t b, const Tensor& in) {
  if (!compressor_) return false;
  const std::string key = fmt::format("bucket{}", b);
  if (stage_ == 1) {
    compressor_->all_reduce(in, comm::ReduceOp::sum, key);
    return true;
  }
  compressor_->reduce_scatter(in, st_[b].rs_out, comm::ReduceOp::sum, key);
  return true;
}

}  // namespace atl::parallel
