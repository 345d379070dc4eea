// Deterministic, rank-disjoint, resumable batches from llm.c token shards. The window/permutation
// scheme is described in data_loader.h; it follows llm.c's shuffled loader (llmc/dataloader.h),
// simplified to one global permutation of fixed windows per epoch.
#include "data/data_loader.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "tensor/rng.h"

namespace atl {

namespace fs = std::filesystem;

nlohmann::json DataLoaderState::to_json() const {
  return {{"epoch", epoch}, {"position", position}, {"num_windows", num_windows},
          {"seed", seed},   {"rank", rank},         {"world_size", world_size}};
}

DataLoaderState DataLoaderState::from_json(const nlohmann::json& j) {
  DataLoaderState s;
  try {
    s.epoch = j.at("epoch").get<uint64_t>();
    s.position = j.at("position").get<uint64_t>();
    s.num_windows = j.at("num_windows").get<uint64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.rank = j.at("rank").get<int>();
    s.world_size = j.at("world_size").get<int>();
  } catch (const nlohmann::json::exception& e) {
    fail("data loader state {} is incomplete: {}", j.dump(), e.what());
  }
  return s;
}

static std::vector<std::string> resolve_files(const std::string& p, const std::string& split) {
  std::vector<std::string> files;
  std::error_code ec;
  if (p.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    int rc = ::glob(p.c_str(), 0, nullptr, &g);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) files.push_back(g.gl_pathv[i]);
    globfree(&g);
    ATOLL_CHECK(!files.empty(), "no token shards match {}; run `atoll data prepare ...` first", p);
  } else {
    ATOLL_CHECK(fs::exists(p, ec),
                "data directory {} does not exist; run `atoll data prepare --out {}` first (add "
                "--input FILE... for your own text; without it the fortunes corpus is used)",
                p, p);
    if (fs::is_regular_file(p, ec)) return {p};
    for (const auto& e : fs::directory_iterator(p, ec)) {
      std::string n = e.path().filename().string();
      if (n.rfind(split + "_", 0) == 0 && e.path().extension() == ".bin")
        files.push_back(e.path().string());
    }
    ATOLL_CHECK(!files.empty(),
                "{} holds no {}_*.bin shards; run `atoll data prepare --out {}` first{}", p,
                split, p,
                split == "val"
                    ? " (training evaluates on a validation split: prepare with a --val-fraction "
                      "above 0, from inputs of at least 2 documents)"
                    : "");
  }
  std::sort(files.begin(), files.end());
  return files;
}

DataLoader::DataLoader(const std::string& pattern_or_dir, const std::string& split, int B, int T,
                       int rank, int world_size, uint64_t seed)
    : B_(B), T_(T), rank_(rank), world_(world_size), seed_(seed), shuffle_(split != "val") {
  ATOLL_CHECK(split == "train" || split == "val", "data split '{}' must be train or val", split);
  ATOLL_CHECK(B > 0 && T > 0, "batch size B={} and sequence length T={} must be positive", B, T);
  ATOLL_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "rank {} is not in [0, {})", rank,
              world_size);
  files_ = resolve_files(pattern_or_dir, split);
  window_start_.push_back(0);
  for (const auto& f : files_) {
    shards_.emplace_back(f);
    size_t n = shards_.back().size();
    total_tokens_ += n;
    window_start_.push_back(window_start_.back() + (n > 0 ? (n - 1) / size_t(T) : 0));
  }
  ATOLL_CHECK(num_windows() < (uint64_t(1) << 32), "{} windows are too many", num_windows());
  rows_per_epoch_ = num_windows() / uint64_t(world_);
  ATOLL_CHECK(rows_per_epoch_ > 0,
              "the {} split of {} has {} tokens: too few for one sequence of T={} (+1) per rank "
              "across {} ranks; use a smaller T or more data",
              split, pattern_or_dir, total_tokens_, T, world_);
  start_epoch(0);
}

void DataLoader::start_epoch(uint64_t e) {
  epoch_ = e;
  position_ = 0;
  if (!shuffle_) {
    perm_.clear();
    return;
  }
  const uint64_t n = num_windows();
  perm_.resize(n);
  for (uint64_t i = 0; i < n; ++i) perm_[i] = uint32_t(i);
  // Every rank draws the same permutation: the stream is the epoch, never the rank.
  Rng rng(seed_, e);
  for (uint64_t i = n; i > 1; --i) std::swap(perm_[i - 1], perm_[rng.below(i)]);
}

void DataLoader::read_window(uint64_t w, int32_t* in, int32_t* tgt) const {
  size_t s = size_t(std::upper_bound(window_start_.begin(), window_start_.end(), w) -
                    window_start_.begin()) -
             1;
  const size_t first = size_t(w - window_start_[s]) * size_t(T_);
  shards_[s].read(first, size_t(T_), in);
  shards_[s].read(first + 1, size_t(T_), tgt);
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
  for (int b = 0; b < B_; ++b) {
    if (position_ >= rows_per_epoch_) start_epoch(epoch_ + 1);
    uint64_t slot = position_ * uint64_t(world_) + uint64_t(rank_);
    uint64_t w = perm_.empty() ? slot : perm_[slot];
    read_window(w, inputs + size_t(b) * size_t(T_), targets + size_t(b) * size_t(T_));
    ++position_;
  }
  if (vocab_limit_ >= 0) {
    const size_t n = size_t(B_) * size_t(T_);
    for (size_t i = 0; i < n; ++i)
      // Unsigned: a uint32 id of 2^31 or more reads as a negative int32.
      ATOLL_CHECK(uint32_t(inputs[i]) < uint32_t(vocab_limit_) &&
                      uint32_t(targets[i]) < uint32_t(vocab_limit_),
                  "token id {} in the data is >= the model's vocab size {}; the data was "
                  "prepared with a larger tokenizer",
                  std::max(uint32_t(inputs[i]), uint32_t(targets[i])), vocab_limit_);
  }
}

void DataLoader::reset() {
  start_epoch(0);
}

void DataLoader::set_uneven(bool on) {
  const uint64_t n = num_windows(), w = uint64_t(world_), r = uint64_t(rank_);
  rows_per_epoch_ = on ? (n > r ? (n - r + w - 1) / w : 0) : n / w;
  ATOLL_CHECK(rows_per_epoch_ > 0, "rank {} of {}: no window of the data is left for it ({} windows)", rank_, world_, n);
}

uint64_t DataLoader::batches_left(uint64_t epochs) const {
  if (epoch_ >= epochs) return 0;
  return ((epochs - epoch_) * rows_per_epoch_ - position_) / uint64_t(B_);
}

DataLoaderState DataLoader::state() const {
  DataLoaderState s;
  s.epoch = epoch_;
  s.position = position_;
  s.num_windows = num_windows();
  s.seed = seed_;
  s.rank = rank_;
  s.world_size = world_;
  return s;
}

void DataLoader::set_state(const DataLoaderState& s) {
  ATOLL_CHECK(s.num_windows == num_windows(),
              "cannot resume the data loader: the saved state is for {} windows but the data now "
              "has {} (T={}); was the data re-prepared or T changed?",
              s.num_windows, num_windows(), T_);
  ATOLL_CHECK(s.seed == seed_ && s.world_size == world_ && s.rank == rank_,
              "cannot resume the data loader: saved for seed {} rank {}/{}, now seed {} rank {}/{}",
              s.seed, s.rank, s.world_size, seed_, rank_, world_);
  ATOLL_CHECK(s.position <= rows_per_epoch_, "data loader position {} is past the epoch's {} rows",
              s.position, rows_per_epoch_);
  if (s.epoch != epoch_) start_epoch(s.epoch);
  position_ = s.position;
}

void DataLoader::validate_vocab(int32_t vocab) {
  ATOLL_CHECK(vocab > 0, "vocab size {} must be positive", vocab);
  for (const auto& sh : shards_) {
    const uint32_t m = sh.max_token();
    ATOLL_CHECK(sh.size() == 0 || int64_t(m) < int64_t(vocab),
                "{} holds token id {}, but the model's vocab size is {}: the data was prepared "
                "with a different tokenizer; set the model's vocab_size to at least {} or "
                "re-prepare the data",
                sh.path(), m, vocab, int64_t(m) + 1);
  }
  vocab_limit_ = vocab;
}

}  // namespace atl
