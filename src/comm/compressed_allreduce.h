// An all-reduce over compressed data (issue 13 item 6), reduce-scatter then all-gather:
//  1. every rank encodes its tensor in W equal chunks (after GIFT's transform and error feedback,
//     when configured) and all_to_all sends chunk j to rank j;
//  2. rank j decodes the W encodings of its chunk and sums them IN F32 (rank order, so every run
//     and every rank rounds the same way) — never in the low precision;
//  3. the reduced chunk is re-encoded (codec_gather = "encoded", with its own error feedback) or
//     sent as f32, all-gathered, and decoded by everyone, the owner included, so that every rank
//     ends with bit-identical values;
//  4. GIFT's transform is undone and its geometry updated from the reduced tensor.
// Bytes sent per rank are counted (what this rank puts on the wire, payload only), next to what a
// ring all-reduce of the same tensor in f32 would send: 2 (W-1) ceil(n/W) 4 bytes.
#pragma once
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "comm/codec.h"
#include "comm/codec_gift.h"
#include "comm/communicator.h"

namespace atl::comm {

// A matrix inside a flat tensor (row-major), for GIFT.
struct MatrixSpan {
  int64_t offset, rows, cols;
};

struct CompressionStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;  // by this rank
  int64_t f32_bytes = 0;   // a ring f32 all-reduce of the same tensors
  int64_t gift_matrices = 0, gift_active = 0;  // at the last call, over all keys
  double ratio() const { return bytes_sent > 0 ? double(f32_bytes) / double(bytes_sent) : 0.0; }
};

// Collective at setup: every rank's spec is compared with everyone's (exchange_codec_spec), so a
// codec that one rank does not know, or a different setting, is refused on every rank with the
// reason before any step. Refuses spec.none().
class CompressedAllReducer {
 public:
  // exchange false skips the setup check (the caller vouches that every rank passes the same spec).
  CompressedAllReducer(Communicator* comm, CodecSpec spec, bool exchange = true);
  ~CompressedAllReducer();
  // In place over every rank's t (f32, contiguous): the sum (or avg) over ranks, bit-identical on
  // every rank. key names the tensor for its error-feedback residual and GIFT state; mats (used on
  // a key's first call) are the matrices within t that GIFT may transform.
  void all_reduce(const Tensor& t, ReduceOp op, const std::string& key, const std::vector<MatrixSpan>& mats = {});
  // The same all-reduce, queued whole on the communicator's worker (encode, all_to_all, decode
  // and sum, re-encode, all_gather, decode: comm::Communicator::run_async between the
  // collectives) and returned at once; the function waits for it. t must stay untouched until
  // then. all_reduce() is start_all_reduce()(), so both give the same bits. Several may be in
  // flight (they run in issue order); state_tensors() / load_state_tensors() only when none is.
  std::function<void()> start_all_reduce(const Tensor& t, ReduceOp op, const std::string& key,
                                         const std::vector<MatrixSpan>& mats = {});
  // In place of comm.reduce_scatter(in, out, op) (ZeRO-2): in holds W equal chunks of
  // out.numel(); this rank's out gets the sum (or avg) of every rank's DECODED chunk, summed in
  // f32 in rank order (steps 1 and 2 above). Error feedback as all_reduce's local encode; no GIFT
  // (its geometry needs the whole reduced tensor). in and out may overlap (in is read first).
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, const std::string& key);
  const CompressionStats& stats() const { return stats_; }
  // What a bit-exact resume needs, per key: "<key>.meta" (i64 [n, calls]: the call count seeds
  // stochastic rounding) and, with error feedback, "<key>.residual" / "<key>.residual2" (f32).
  // With GIFT, "<key>.gift" too: its matrices and their learned geometry (bit-exact).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  // The inverse, replacing every key's state; `what` names the source for messages.
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& sd, const std::string& what);
  const CodecSpec& spec() const { return spec_; }
  const Codec& codec() const { return *codec_; }
  bool gift() const { return gift_; }

 private:
  struct State;
  State& state(const std::string& key, int64_t n, const std::vector<MatrixSpan>& mats);
  RoundingRng rng(uint64_t call, int phase, int chunk) const;
  struct Flight;
  // Step 1 on x (W chunks of c, transformed): adds and updates the local residual, encodes into
  // send (W chunks of `words`). Step 2: this rank's f32 sum of the decoded chunks in recv.
  void encode_chunks(State& st, uint64_t call, std::vector<float>& x, int64_t n, int64_t c, int64_t words,
                     const Tensor& send) const;
  void sum_chunks(const Tensor& recv, int64_t c, int64_t words, ReduceOp op, std::vector<float>& acc) const;
  // start_all_reduce's local steps, on the communicator's worker.
  void encode_step(Flight& f);
  void gather_step(Flight& f);
  void finish_step(Flight& f);
  Communicator* comm_;
  CodecSpec spec_;
  bool gift_ = false;
  std::unique_ptr<Codec> codec_;
  std::map<std::string, std::unique_ptr<State>> states_;
  CompressionStats stats_;
  std::mutex mu_;  // states_ (inserted by callers, walked by finish_step) and stats_
  WorkPtr last_;   // the last step queued by start_all_reduce (the destructor waits for it)
};

// Collective: all-gathers spec.describe() (and a hash of it) and fails on every rank, naming each
// rank's setting, when they differ; then fails (on every rank alike) when the codec is unknown.
// what: the config key for messages ("parallel.codec").
void exchange_codec_spec(Communicator& comm, const CodecSpec& spec, const std::string& what);

// One compressed all-reduce with a named codec and no state (no error feedback, no GIFT history),
// e.g. for DiLoCo's pseudo-gradients: a call site that wants either keeps a CompressedAllReducer.
// Not collective-checked: every rank must pass the same codec. Returns the bytes this rank sent.
int64_t compressed_all_reduce(Communicator& comm, const Tensor& t, const std::string& codec,
                              ReduceOp op = ReduceOp::avg, bool stochastic = false, uint64_t seed = 0);

}  // namespace atl::comm
