// Ring reduce-scatter: Patarasuk & Yuan (2009), "Bandwidth optimal all-reduce algorithms for
// clusters of workstations" — the reduce-scatter half of the ring all-reduce. Each of the N-1
// steps sends one chunk to the right neighbour and folds the chunk from the left into a local
// accumulator, so every rank sends (N-1)/N of the buffer: the bandwidth-optimal amount.
// Runs over Gloo's point-to-point (unbound) buffers, so Gloo's transport, timeouts and error
// reporting apply unchanged.
#ifdef ATOLL_HAVE_GLOO
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>

#include "comm/gloo_communicator.h"

namespace atl::comm {

namespace {
template <typename T>
void fold(T* acc, const T* in, size_t n, ReduceOp op) {
  if (op == ReduceOp::max) {
    for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] += in[i];
  }
}
void fold_any(DType dt, void* acc, const void* in, size_t n, ReduceOp op) {
  switch (dt) {
    case DType::f32: return fold(static_cast<float*>(acc), static_cast<const float*>(in), n, op);
    case DType::i32: return fold(static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), n, op);
    case DType::i64: return fold(static_cast<int64_t*>(acc), static_cast<const int64_t*>(in), n, op);
    default: fail("ring reduce_scatter: dtype {} is not reduced directly", dtype_name(dt));
  }
}
constexpr uint8_t kRingSlotPrefix = 0x41;  // clear of Gloo's own prefixes (0x01..0x08)
}  // namespace

void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& ctx, const Tensor& in,
                         const Tensor& out, ReduceOp op, uint32_t tag, Millis timeout) {
  const int n = ctx->size, r = ctx->rank;
  const size_t es = dtype_size(in.dtype());
  const size_t chunk = size_t(out.numel()), cb = chunk * es;
  if (n == 1) {
    std::memcpy(out.raw(), in.raw(), cb);
    return;
  }
  if (chunk == 0) return;
  // The accumulator starts as our own input; chunk r ends up fully reduced.
  std::vector<char> acc(static_cast<const char*>(in.raw()), static_cast<const char*>(in.raw()) + n * cb);
  std::vector<char> tmp(cb);
  auto send_buf = ctx->createUnboundBuffer(acc.data(), acc.size());
  auto recv_buf = ctx->createUnboundBuffer(tmp.data(), tmp.size());
  const uint64_t slot = gloo::Slot::build(kRingSlotPrefix, tag);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const auto until = std::chrono::steady_clock::now() + timeout;
  auto left_ms = [&] {
    auto d = std::chrono::duration_cast<Millis>(until - std::chrono::steady_clock::now());
    return std::max(d, Millis(1));
  };
  for (int s = 0; s < n - 1; ++s) {
    const int send_idx = (r - s - 1 + 2 * n) % n, recv_idx = (r - s - 2 + 2 * n) % n;
    recv_buf->recv(left, slot, 0, cb);
    send_buf->send(right, slot, size_t(send_idx) * cb, cb);
    ATOLL_CHECK(recv_buf->waitRecv(left_ms()), "ring step {}: receive from rank {} was aborted", s, left);
    fold_any(in.dtype(), acc.data() + size_t(recv_idx) * cb, tmp.data(), chunk, op);
    ATOLL_CHECK(send_buf->waitSend(left_ms()), "ring step {}: send to rank {} was aborted", s, right);
  }
  std::memcpy(out.raw(), acc.data() + size_t(r) * cb, cb);
}

}  // namespace atl::comm
#endif
