#include "data/varlen_packer.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace atl {

double PackedRow::cost(double quad) const {
  double c = double(used());
  for (int64_t l : doc_lengths) c += quad * double(l) * double(l);
  return c;
}

std::vector<PackedRow> pack_documents(const std::vector<VarlenDocument>& docs, int64_t capacity) {
  std::vector<size_t> order(docs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  // Longest first; equal lengths keep the batch's order (stable), so packing is deterministic.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return docs[a].targets() > docs[b].targets(); });
  int64_t longest = 0;
  for (auto& d : docs) longest = std::max(longest, d.targets());
  if (capacity <= 0) capacity = longest;
  ATOLL_CHECK(capacity >= longest, "packing: a document of {} targets does not fit rows of {}", longest, capacity);
  std::vector<PackedRow> rows;
  for (size_t i : order) {
    const VarlenDocument& d = docs[i];
    const int64_t n = d.targets();
    if (n <= 0) continue;
    PackedRow* r = nullptr;
    for (PackedRow& x : rows)
      if (x.used() + n <= capacity) {
        r = &x;
        break;
      }
    if (!r) r = &rows.emplace_back();
    const int32_t id = int32_t(r->doc_lengths.size());
    r->input.insert(r->input.end(), d.tokens.begin(), d.tokens.end() - 1);
    r->target.insert(r->target.end(), d.tokens.begin() + 1, d.tokens.end());
    r->doc_ids.insert(r->doc_ids.end(), size_t(n), id);
    for (int64_t t = 0; t < n; ++t) r->positions.push_back(int32_t(t));
    r->doc_lengths.push_back(n);
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const PackedRow& a, const PackedRow& b) { return a.used() > b.used(); });
  return rows;
}

std::vector<std::vector<int64_t>> balance_rows(const std::vector<PackedRow>& rows, const std::vector<int64_t>& which,
                                               int64_t parts, double quad) {
  ATOLL_CHECK(parts >= 1, "balance_rows: {} parts", parts);
  std::vector<std::vector<int64_t>> bins(static_cast<size_t>(parts));
  std::vector<double> load(static_cast<size_t>(parts), 0.0);
  for (int64_t i : which) {
    const size_t b = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    bins[b].push_back(i);
    load[b] += rows[size_t(i)].cost(quad);
  }
  for (auto& b : bins) std::sort(b.begin(), b.end());
  return bins;
}

PackedTensors rows_to_tensors(const std::vector<PackedRow>& rows, const std::vector<int64_t>& which, int64_t T) {
  const int64_t n = std::max<int64_t>(1, int64_t(which.size()));
  PackedTensors p;
  std::vector<int32_t> in(size_t(n * T), 0), tg(size_t(n * T), -1), id(size_t(n * T), -1), pos(size_t(n * T));
  for (size_t k = 0; k < which.size(); ++k) {
    const PackedRow& r = rows[size_t(which[k])];
    ATOLL_CHECK(r.used() <= T, "rows_to_tensors: a row of {} positions in rows of {}", r.used(), T);
    std::copy(r.input.begin(), r.input.end(), in.begin() + int64_t(k) * T);
    std::copy(r.target.begin(), r.target.end(), tg.begin() + int64_t(k) * T);
    std::copy(r.doc_ids.begin(), r.doc_ids.end(), id.begin() + int64_t(k) * T);
    ATOLL_CHECK(r.positions.size() == r.input.size(), "rows_to_tensors: a row of {} positions with {} position ids",
                r.used(), r.positions.size());
    std::copy(r.positions.begin(), r.positions.end(), pos.begin() + int64_t(k) * T);
    p.targets += r.used();
  }
  for (int64_t k = 0; k < n; ++k) {  // padding counts on from the row's last position
    const int64_t used = k < int64_t(which.size()) ? rows[size_t(which[size_t(k)])].used() : 0;
    for (int64_t t = used; t < T; ++t) pos[size_t(k * T + t)] = t == 0 ? 0 : pos[size_t(k * T + t - 1)] + 1;
  }
  p.input = Tensor::from_vector_i32(in, {n, T});
  p.target = Tensor::from_vector_i32(tg, {n, T});
  p.doc_ids = Tensor::from_vector_i32(id, {n, T});
  p.positions = Tensor::from_vector_i32(pos, {n, T});
  return p;
}

}  // namespace atl
