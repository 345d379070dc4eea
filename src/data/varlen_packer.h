// Packing a variable-length batch (issue 12, item 5): whole documents into rows, with the
// document boundaries kept for document masks (ops::attention and ring attention take doc ids:
// a token sees only earlier tokens of its own document), and rows dealt out to ranks and
// micro-batches. A batch's rows are a function of its documents only (first-fit decreasing into
// rows as long as its longest document), so every parallel layout — data-parallel ranks,
// context-parallel groups, accumulation micro-batches — computes the same rows, hence the same
// loss: a layout changes only how rows are grouped and where a row is cut, never a row itself.
// Positions restart at every document (0 at its first token), as if the document were alone: with
// the document mask, a packed document's forward is that document's own forward.
#pragma once
#include <cstdint>
#include <vector>

#include "data/varlen_corpus.h"
#include "tensor/tensor.h"

namespace atl {

struct PackedRow {
  std::vector<int32_t> input, target, doc_ids;  // of `used()` positions
  std::vector<int32_t> positions;               // each token's position in its own document
  std::vector<int64_t> doc_lengths;             // the documents in the row, in order
  int64_t used() const { return int64_t(input.size()); }
  // Work of the row for balancing: positions plus quad·Σ length² (attention within documents).
  double cost(double quad) const;
};

// First-fit decreasing: the documents, longest first, each into the first row with room, rows of
// `capacity` positions (0: the longest document's length). Rows in order of decreasing use.
std::vector<PackedRow> pack_documents(const std::vector<VarlenDocument>& docs, int64_t capacity = 0);

// Deals row indices out to `parts` bins: each row, in the given order (decreasing use), to the
// bin with the least cost so far (ties: the lower bin); a bin's rows keep increasing indices.
// Bins may be empty when rows are fewer than parts.
std::vector<std::vector<int64_t>> balance_rows(const std::vector<PackedRow>& rows, const std::vector<int64_t>& which,
                                               int64_t parts, double quad = 0);

// Rows as [n, T] i32 tensors, T at least every row's use (padding: input 0, target -1, which no
// loss counts, doc id -1, which no real token sees; positions count on from the row's last
// document, so they stay below T and a row's positions are runs of consecutive values).
// n = 0 gives one row of padding.
struct PackedTensors {
  Tensor input, target, doc_ids, positions;
  int64_t targets = 0;  // real targets (>= 0) in the rows
};
PackedTensors rows_to_tensors(const std::vector<PackedRow>& rows, const std::vector<int64_t>& which, int64_t T);

}  // namespace atl
