// Document masks as a model sees them: rows that pack several documents (data/varlen_packer.h)
// carry doc ids [B, T] i32, a maximal run of equal ids being one document, and attention lets a
// token see only earlier tokens of its own document (ops::attention with doc ids; ring attention
// under context parallelism takes the whole row's ids). The ids are set before the forward that
// uses them and stay until replaced; an undefined tensor is plain causal attention (the default).
// Position ids [B, T] i32 (the packer's: 0 at each document's first token) go with them, so that
// learned position tables and RoPE see each document at the positions it would have alone.
#pragma once
#include "tensor/tensor.h"

namespace atl::nn {

class DocumentMasked {
 public:
  virtual ~DocumentMasked() = default;
  // doc_ids [B, T] of the rows the next loss() calls take (the whole rows, also under context
  // parallelism, where each rank holds some spans of them); undefined: no document mask.
  virtual void set_document_ids(const Tensor& doc_ids) = 0;
  // positions [B, T] of the same rows (each below the model's block size), or undefined: token t
  // of a row at position t (the default). Under context parallelism, the whole rows' positions.
  virtual void set_position_ids(const Tensor& positions) = 0;
};

}  // namespace atl::nn
