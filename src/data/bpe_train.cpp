// Byte-level BPE training (Sennrich et al. 2016; GPT-2's byte-level variant, Radford et al. 2019).
//
// Words are counted once; each distinct word is a symbol sequence with a frequency. Pair counts
// are kept incrementally: merging a pair rewrites only the words that contain it (found through a
// pair -> words index), subtracting their old pairs and adding their new ones. The most frequent
// pair comes from a max-heap whose stale entries (count changed since they were pushed) are
// skipped when popped. Cost per merge is proportional to the words it touches, so a few thousand
// merges over a few MB of text take seconds.
#include "data/bpe_train.h"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "data/bpe_pretokenize.h"

namespace atl {

namespace {

uint64_t key_of(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

struct HeapEntry {
  int64_t count;
  uint64_t key;
  // priority_queue pops the largest: higher count first, then the smaller key.
  bool operator<(const HeapEntry& o) const {
    return count != o.count ? count < o.count : key > o.key;
  }
};

}  // namespace

BpeVocab train_bpe(const std::vector<std::string>& documents, const BpeTrainOptions& opt) {
  ATOLL_CHECK(opt.vocab_size >= 257 && opt.vocab_size < (1 << 24),
              "BPE vocab size {} must be at least 257 (256 bytes + <|endoftext|>)", opt.vocab_size);
  BpeVocab v;
  const auto& b2u = gpt2_byte_to_unicode();
  // GPT-2's id order for the bytes: by their unicode spelling's code point.
  std::vector<int> order(256);
  for (int b = 0; b < 256; ++b) order[size_t(b)] = b;
  std::sort(order.begin(), order.end(),
            [&](int x, int y) { return b2u[size_t(x)] < b2u[size_t(y)]; });
  std::array<int32_t, 256> byte_id{};
  for (int i = 0; i < 256; ++i) {
    v.tokens.push_back(std::string(1, char(order[size_t(i)])));
    byte_id[size_t(order[size_t(i)])] = i;
  }

  // Distinct words and their frequencies.
  std::unordered_map<std::string, int64_t> counts;
  for (const auto& doc : documents)
    for (std::string_view w : gpt2_pretokenize(doc)) ++counts[std::string(w)];
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  counts.clear();
  std::sort(sorted.begin(), sorted.end());  // fixed order: results never depend on hashing
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> freq(sorted.size());
  for (size_t w = 0; w < sorted.size(); ++w) {
    freq[w] = sorted[w].second;
    for (char c : sorted[w].first) words[w].push_back(byte_id[uint8_t(c)]);
  }
  sorted.clear();

  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t k = key_of(words[w][i], words[w][i + 1]);
      pair_count[k] += freq[w];
      auto& pw = pair_words[k];
      if (pw.empty() || pw.back() != int32_t(w)) pw.push_back(int32_t(w));
    }
  std::priority_queue<HeapEntry> heap;
  for (auto& [k, c] : pair_count) heap.push({c, k});

  const size_t n_tokens = size_t(opt.vocab_size) - 1;  // all but <|endoftext|>
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t i = 0; i < v.tokens.size(); ++i) id_of.emplace(v.tokens[i], int32_t(i));
  std::vector<uint64_t> touched;
  std::vector<int32_t> rebuilt;
  while (v.tokens.size() < n_tokens && !heap.empty()) {
    HeapEntry top = heap.top();
    heap.pop();
    auto pc = pair_count.find(top.key);
    if (pc == pair_count.end() || pc->second != top.count) continue;  // stale
    if (top.count < opt.min_pair_count) break;
    const int32_t a = int32_t(top.key >> 32), b = int32_t(uint32_t(top.key));
    // Two merges may spell the same bytes (e.g. "t"+"he" and "th"+"e"); like encoder.json, the
    // vocabulary then holds the token once and both merges produce its id.
    std::string merged = v.tokens[size_t(a)] + v.tokens[size_t(b)];
    auto [known, fresh] = id_of.emplace(merged, int32_t(v.tokens.size()));
    const int32_t id = known->second;
    if (fresh) v.tokens.push_back(std::move(merged));
    v.merges.emplace_back(a, b);

    std::vector<int32_t> ws = std::move(pair_words[top.key]);
    pair_words.erase(top.key);
    std::sort(ws.begin(), ws.end());
    ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
    touched.clear();
    for (int32_t w : ws) {
      auto& s = words[size_t(w)];
      rebuilt.clear();
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          rebuilt.push_back(id);
          i += 2;
        } else {
          rebuilt.push_back(s[i++]);
        }
      }
      if (rebuilt.size() == s.size()) continue;  // index entry was stale
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t k = key_of(s[i], s[i + 1]);
        pair_count[k] -= freq[size_t(w)];
        touched.push_back(k);
      }
      for (size_t i = 0; i + 1 < rebuilt.size(); ++i) {
        uint64_t k = key_of(rebuilt[i], rebuilt[i + 1]);
        pair_count[k] += freq[size_t(w)];
        touched.push_back(k);
        auto& pw = pair_words[k];
        if (pw.empty() || pw.back() != w) pw.push_back(w);
      }
      s.swap(rebuilt);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) {
      auto it = pair_count.find(k);
      if (it->second <= 0) {
        pair_count.erase(it);
        pair_words.erase(k);
      } else {
        heap.push({it->second, k});
      }
    }
    if (v.merges.size() % 1000 == 0)
      log::debug("bpe: {} merges, last \"{}\" x{}", v.merges.size(), v.tokens.back(), top.count);
  }
  if (v.tokens.size() < n_tokens)
    log::warn(
        "bpe: the corpus supports only {} merges (pairs occurring >= {} times); the "
        "vocabulary has {} ids instead of {}",
        v.merges.size(), opt.min_pair_count, v.tokens.size() + 1, opt.vocab_size);
  v.eot = int32_t(v.tokens.size());
  v.tokens.emplace_back();  // eot has no bytes
  return v;
}

}  // namespace atl
