// Ring reduce-scatter: Patarasuk & Yuan (2009), "Bandwidth optimal all-reduce algorithms for
// clusters of workstations" — the reduce-scatter half of the ring all-reduce. Each of the N-1
// steps sends one chunk to the right neighbour and folds the chunk from the left into a local
// accumulator, so every rank sends (N-1)/N of the buffer: the bandwidth-optimal amount.
// Runs over Gloo's point-to-point (unbound) buffers, so Gloo's transport, timeouts and error
// reporting apply unchanged.
//
// Memory. The chunk a rank folds at step s is the one it sends at step s+1, so the accumulator
// never needs more than the chunk in flight, and the input is only read. The last step, whose
// fold yields this rank's result, moves in pieces of at most kPiece bytes: each piece lands
// straight in `out` or, when `out` is chunk `rank` of the input (in place, NCCL's convention),
// in one of two piece buffers and is folded into `out` from there. So on 2 ranks the collective
// needs two pieces beyond its arguments, on 3 one chunk more, on more two chunks. ZeRO reduces
// buckets as large as a transformer block, so a full-size staging copy here (as this once made)
// or a chunk-sized output buffer per bucket in flight was one more block-sized buffer resident.
#ifdef ATOLL_HAVE_GLOO
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/gloo_communicator.h"

namespace atl::comm {

namespace {
// dst[i] = own[i] (op) got[i]; dst may be own or got.
template <typename T>
void fold(T* dst, const T* own, const T* got, size_t n, ReduceOp op) {
  if (op == ReduceOp::max) {
    for (size_t i = 0; i < n; ++i) dst[i] = std::max(own[i], got[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = own[i] + got[i];
  }
}
void fold_any(DType dt, void* dst, const void* own, const void* got, size_t n, ReduceOp op) {
  switch (dt) {
    case DType::f32:
      return fold(static_cast<float*>(dst), static_cast<const float*>(own), static_cast<const float*>(got), n, op);
    case DType::i32:
      return fold(static_cast<int32_t*>(dst), static_cast<const int32_t*>(own), static_cast<const int32_t*>(got), n,
                  op);
    case DType::i64:
      return fold(static_cast<int64_t*>(dst), static_cast<const int64_t*>(own), static_cast<const int64_t*>(got), n,
                  op);
    default: fail("ring reduce_scatter: dtype {} is not reduced directly", dtype_name(dt));
  }
}
constexpr uint8_t kRingSlotPrefix = 0x41;  // clear of Gloo's own prefixes (0x01..0x08)
// Pieces of the last step: small next to a block's chunk, large enough that per-message latency
// stays negligible (every rank must use the same value: it fixes the message sizes).
constexpr size_t kPiece = size_t(256) << 10;
using Buf = std::unique_ptr<gloo::transport::UnboundBuffer>;
}  // namespace

void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& ctx, const Tensor& in,
                         const Tensor& out, ReduceOp op, uint32_t tag, Millis timeout) {
  const int n = ctx->size, r = ctx->rank;
  const DType dt = in.dtype();
  const size_t es = dtype_size(dt);
  const size_t chunk = size_t(out.numel()), cb = chunk * es;
  if (n == 1) {
    if (out.raw() != in.raw()) std::memcpy(out.raw(), in.raw(), cb);
    return;
  }
  if (chunk == 0) return;
  char* src = static_cast<char*>(const_cast<void*>(in.raw()));  // only ever read
  char* dst = static_cast<char*>(out.raw());
  const bool in_place = dst == src + size_t(r) * cb;
  std::vector<char> copy;
  if (!in_place && dst < src + size_t(n) * cb && src < dst + cb) {  // some other overlap: read a copy
    copy.assign(src, src + size_t(n) * cb);
    src = copy.data();
  }
  const uint64_t slot = gloo::Slot::build(kRingSlotPrefix, tag);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const auto until = std::chrono::steady_clock::now() + timeout;
  auto left_ms = [&] {
    auto d = std::chrono::duration_cast<Millis>(until - std::chrono::steady_clock::now());
    return std::max(d, Millis(1));
  };
  auto wait_recv = [&](gloo::transport::UnboundBuffer* b, int s) {
    ATOLL_CHECK(b->waitRecv(left_ms()), "ring step {}: receive from rank {} was aborted", s, left);
  };
  auto wait_send = [&](gloo::transport::UnboundBuffer* b, int s) {
    ATOLL_CHECK(b->waitSend(left_ms()), "ring step {}: send to rank {} was aborted", s, right);
  };
  Buf input = ctx->createUnboundBuffer(src, size_t(n) * cb);
  // Steps 0 .. n-3 (none on 2 ranks): whole chunks, received into acc[s % 2] and sent on from it.
  std::vector<char> accs(cb * size_t(std::min(n - 2, 2)));
  Buf acc[2];
  for (int k = 0; k < std::min(n - 2, 2); ++k) acc[k] = ctx->createUnboundBuffer(accs.data() + size_t(k) * cb, cb);
  auto send_idx = [&](int s) { return (r - s - 1 + 2 * n) % n; };
  auto recv_idx = [&](int s) { return (r - s - 2 + 2 * n) % n; };
  for (int s = 0; s + 2 < n; ++s) {
    gloo::transport::UnboundBuffer* rb = acc[s % 2].get();
    gloo::transport::UnboundBuffer* sb = s == 0 ? input.get() : acc[(s - 1) % 2].get();
    rb->recv(left, slot, 0, cb);
    sb->send(right, slot, s == 0 ? size_t(send_idx(s)) * cb : 0, cb);
    wait_recv(rb, s);
    char* a = accs.data() + size_t(s % 2) * cb;
    fold_any(dt, a, src + size_t(recv_idx(s)) * cb, a, chunk, op);
    wait_send(sb, s);
  }
  // The last step, in pieces: all sends posted at once (they read memory that stays put), each
  // received piece folded with this rank's own chunk into `out`.
  const int s = n - 2;
  gloo::transport::UnboundBuffer* sb = s == 0 ? input.get() : acc[(s - 1) % 2].get();
  const size_t sbase = s == 0 ? size_t(send_idx(s)) * cb : 0;
  const char* own = src + size_t(r) * cb;
  const size_t step = std::max(es, kPiece / es * es), pieces = (cb + step - 1) / step;
  auto piece_len = [&](size_t k) { return std::min(step, cb - k * step); };
  std::vector<char> spare(in_place ? 2 * std::min(step, cb) : 0);
  Buf landing[2];
  if (in_place)
    for (int k = 0; k < 2; ++k)
      landing[k] = ctx->createUnboundBuffer(spare.data() + size_t(k) * std::min(step, cb), std::min(step, cb));
  else
    landing[0] = ctx->createUnboundBuffer(dst, cb);
  auto post_recv = [&](size_t k) {
    if (in_place) landing[k % 2]->recv(left, slot, 0, piece_len(k));
    else landing[0]->recv(left, slot, k * step, piece_len(k));
  };
  for (size_t k = 0; k < pieces; ++k) sb->send(right, slot, sbase + k * step, piece_len(k));
  // Messages from one peer on one slot match the receives in the order they were posted.
  for (size_t k = 0; k < (in_place ? std::min<size_t>(2, pieces) : pieces); ++k) post_recv(k);
  for (size_t k = 0; k < pieces; ++k) {
    wait_recv(landing[in_place ? k % 2 : 0].get(), s);
    const char* got = in_place ? spare.data() + (k % 2) * std::min(step, cb) : dst + k * step;
    fold_any(dt, dst + k * step, own + k * step, got, piece_len(k) / es, op);
    if (in_place && k + 2 < pieces) post_recv(k + 2);  // into the landing buffer just folded
  }
  for (size_t k = 0; k < pieces; ++k) wait_send(sb, s);
}

}  // namespace atl::comm
#endif
