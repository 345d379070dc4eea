// Corpus preparation: files -> documents -> tokens -> llm.c shards + meta.json. Documents are
// prefixed with the end-of-text id, the GPT-2/llm.c convention (llm.c dev/data/fineweb.py), so a
// model learns where documents start and the loader may cut windows anywhere.
#include "data/corpus.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "tensor/rng.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace atl {

namespace fs = std::filesystem;

static constexpr int kMetaVersion = 1;
static const char* kDefaultFortunes = "/usr/share/games/fortunes";

std::vector<std::string> split_documents(std::string_view text) {
  std::vector<std::string> docs;
  std::string cur;
  size_t pos = 0;
  auto push = [&] {
    // Trailing/leading blank lines carry nothing; keep the text otherwise as is.
    size_t a = cur.find_first_not_of("\n\r");
    if (a != std::string::npos) docs.push_back(cur.substr(a));
    cur.clear();
  };
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    std::string_view line = text.substr(pos, end - pos);
    std::string_view bare = line;
    while (!bare.empty() && (bare.back() == '\n' || bare.back() == '\r')) bare.remove_suffix(1);
    if (bare == "%") {
      push();
    } else {
      cur.append(line);
    }
    pos = end;
  }
  push();
  return docs;
}

static bool looks_binary(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char buf[4096];
  in.read(buf, sizeof(buf));
  return std::find(buf, buf + in.gcount(), '\0') != buf + in.gcount();
}

std::vector<std::string> list_input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    fs::path p(in);
    std::error_code ec;
    ATOLL_CHECK(fs::exists(p, ec), "input {} does not exist", in);
    if (!fs::is_directory(p, ec)) {
      files.push_back(fs::absolute(p).lexically_normal().string());
      continue;
    }
    std::vector<std::string> found;
    size_t skipped = 0;
    for (auto it = fs::recursive_directory_iterator(p, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      ATOLL_CHECK(!ec, "cannot list {}: {}", in, ec.message());
      const auto& e = *it;
      std::string name = e.path().filename().string();
      if (!name.empty() && name[0] == '.') {
        if (e.is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (e.is_symlink() || !e.is_regular_file()) continue;
      if (looks_binary(e.path())) {
        ++skipped;
        continue;
      }
      found.push_back(fs::absolute(e.path()).lexically_normal().string());
    }
    if (skipped) log::info("data: skipped {} binary file(s) in {}", skipped, in);
    ATOLL_CHECK(!found.empty(), "input directory {} holds no text files", in);
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::string repair_utf8(std::string_view text, size_t* replaced, size_t* first_bad) {
  static const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  size_t bad = 0;
  if (first_bad) *first_bad = std::string::npos;
  for (size_t i = 0; i < text.size();) {
    const uint8_t c = uint8_t(text[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= text.size();
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; ok && k < len; ++k) {
      const uint8_t d = uint8_t(text[i + k]);
      ok = (d & 0xC0) == 0x80;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are invalid UTF-8 too.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
               (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF))
      ok = false;
    if (ok) {
      if (bad) out.append(text.substr(i, len));
      i += len;
      continue;
    }
    if (!bad) out.assign(text.substr(0, i));  // copy only once something needs replacing
    if (first_bad && *first_bad == std::string::npos) *first_bad = i;
    ++bad;
    out += kReplacement;
    ++i;  // one replacement per invalid byte, then resynchronise
  }
  if (replaced) *replaced = bad;
  return bad ? out : std::string(text);
}

std::vector<std::string> read_documents(const std::vector<std::string>& files,
                                        size_t* invalid_utf8) {
  std::vector<std::string> docs;
  size_t total_bad = 0;
  for (const auto& f : files) {
    std::string text = read_file(f);
    // Text never holds NUL; a file that does is an image, an archive, an index... Tokenizing it
    // would train on noise, so it is refused rather than skipped: the user named it.
    size_t nul = text.find('\0');
    ATOLL_CHECK(nul == std::string::npos,
                "{} is a binary file (a NUL byte at offset {}); data prepare reads UTF-8 text "
                "only: remove it from --input",
                f, nul);
    size_t bad = 0, first = 0;
    text = repair_utf8(text, &bad, &first);
    if (bad) {
      log::warn(
          "{}: {} byte(s) of invalid UTF-8 (the first at offset {}) replaced by U+FFFD; convert "
          "the file to UTF-8 first (e.g. `iconv -f latin1 -t utf-8`) to keep those characters",
          f, bad, first);
      total_bad += bad;
    }
    auto d = split_documents(text);
    for (auto& s : d) docs.push_back(std::move(s));
  }
  if (invalid_utf8) *invalid_utf8 = total_bad;
  return docs;
}

static nlohmann::json inputs_json(const std::vector<std::string>& files) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& f : files) {
    std::error_code ec;
    a.push_back({{"path", f}, {"bytes", int64_t(fs::file_size(f, ec))}});
  }
  return a;
}

// Identifies the tokenizer's content, so that retraining a BPE tokenizer in place invalidates data
// prepared with the old one.
static std::string tokenizer_fingerprint(const std::string& spec) {
  if (spec == "byte") return "byte";
  fs::path dir = canonical_tokenizer_spec(spec);
  uint32_t crc = 0;
  for (const char* f : {"encoder.json", "vocab.bpe"}) {
    std::string bytes = read_file((dir / f).string());
    crc = crc32c(bytes.data(), bytes.size(), crc);
  }
  return fmt::format("crc32c:{:08x}", crc);
}

nlohmann::json read_data_meta(const std::string& dir) {
  std::error_code ec;
  ATOLL_CHECK(fs::is_directory(dir, ec),
              "data directory {} does not exist; run `atoll data prepare --out {}` first (add "
              "--input FILE... for your own text; without it the fortunes corpus is used)",
              dir, dir);
  fs::path mp = fs::path(dir) / "meta.json";
  ATOLL_CHECK(fs::is_regular_file(mp, ec),
              "{} is missing, so {} holds no complete prepared data; run `atoll data prepare "
              "--out {}` first",
              mp.string(), dir, dir);
  try {
    return nlohmann::json::parse(read_file(mp.string()));
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON ({}); rerun `atoll data prepare --out {}`", mp.string(), e.what(),
         dir);
  }
}

void check_prepared_tokenizer(const std::string& dir, const std::string& tokenizer_spec) {
  nlohmann::json m = read_data_meta(dir);
  std::string want = canonical_tokenizer_spec(tokenizer_spec);
  std::string have = m.value("tokenizer", std::string("?"));
  ATOLL_CHECK(have == want && m.value("tokenizer_fingerprint", std::string()) ==
                                  tokenizer_fingerprint(tokenizer_spec),
              "the data in {} was prepared with tokenizer {}{}, not {}; re-run `atoll data prepare "
              "--tokenizer {} --out {}` (add --input FILE... unless it is the fortunes corpus)",
              dir, have, have == want ? " (since changed on disk)" : "", want, tokenizer_spec, dir);
}

bool prepared_data_matches(const PrepareOptions& opt) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(opt.out_dir) / "meta.json", ec)) return false;
  nlohmann::json m;
  try {
    m = read_data_meta(opt.out_dir);
    if (m.value("version", 0) != kMetaVersion) return false;
    if (m.at("tokenizer") != canonical_tokenizer_spec(opt.tokenizer)) return false;
    if (m.at("tokenizer_fingerprint") != tokenizer_fingerprint(opt.tokenizer)) return false;
    if (m.at("inputs") != inputs_json(list_input_files(opt.inputs))) return false;
    if (m.at("val_fraction").get<double>() != opt.val_fraction) return false;
    if (m.at("shard_tokens").get<int64_t>() != opt.shard_tokens) return false;
    if (m.at("seed").get<uint64_t>() != opt.seed) return false;
    for (const char* split : {"train", "val"})
      for (const auto& s : m.at("shards").at(split)) {
        fs::path p = fs::path(opt.out_dir) / s.at("file").get<std::string>();
        size_t want = kShardHeaderBytes +
                      size_t(m.value("token_bytes", 2)) * s.at("tokens").get<size_t>();
        if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) != want) return false;
      }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// The marker that says a directory's shards and meta.json were written by atoll, so that a later
// prepare may replace them. Shards without it (or meta.json, which older atoll wrote alone) are
// someone else's: preparing never deletes or overwrites them.
static const char* kOwnerMarker = ".atoll-data";

static void claim_output_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ATOLL_CHECK(!ec, "cannot create {}: {}", dir, ec.message());
  ATOLL_CHECK(fs::is_directory(dir, ec), "data output {} is not a directory", dir);
  const fs::path marker = fs::path(dir) / kOwnerMarker, meta = fs::path(dir) / "meta.json";
  const bool ours = fs::exists(marker, ec) || fs::exists(meta, ec);
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    bool shard_name = n.rfind("train_", 0) == 0 || n.rfind("val_", 0) == 0;
    bool bin = e.path().extension() == ".bin" ||
               (e.path().extension() == ".tmp" && e.path().stem().extension() == ".bin");
    if (shard_name && bin) shards.push_back(e.path());
  }
  std::sort(shards.begin(), shards.end());
  ATOLL_CHECK(ours || shards.empty(),
              "{} holds {} token shard file(s) that atoll did not write ({}{}; there is no "
              "meta.json or {} beside them), and data preparation never deletes or overwrites "
              "files it did not write: give it another output directory (`atoll data prepare "
              "--out DIR`, or data.dir when training with data.auto_prepare), or move those "
              "files away",
              dir, shards.size(), shards.empty() ? "" : shards.front().filename().string(),
              shards.size() > 1 ? ", ..." : "", kOwnerMarker);
  write_file_atomic(marker.string(),
                    "written by `atoll data prepare`: the next prepare into this directory may "
                    "replace its meta.json and train_*.bin / val_*.bin shards\n");
  // Old shards would be picked up by the loader next to new ones: remove them first, and meta.json
  // before anything so that an interrupted run never looks complete.
  fs::remove(meta, ec);
  for (const auto& p : shards) fs::remove(p, ec);
}

nlohmann::json prepare_data(const PrepareOptions& opt) {
  ATOLL_CHECK(!opt.out_dir.empty(), "data prepare: no output directory given");
  ATOLL_CHECK(!opt.inputs.empty(), "data prepare: no input files given");
  ATOLL_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1,
              "validation fraction {} must be in [0, 1)", opt.val_fraction);
  auto t0 = std::chrono::steady_clock::now();
  auto tok = load_tokenizer(opt.tokenizer);
  const int token_bytes = shard_token_bytes(tok->vocab_size());
  std::vector<std::string> files = list_input_files(opt.inputs);
  size_t invalid_utf8 = 0;
  std::vector<std::string> docs = read_documents(files, &invalid_utf8);
  ATOLL_CHECK(!docs.empty(), "the inputs hold no text");

  // Shuffle documents (fortune files are grouped by topic), then hold out the first n_val.
  std::vector<size_t> order(docs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Rng rng(opt.seed, 0);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  size_t n_val = 0;
  if (opt.val_fraction > 0) {
    // Training evaluates on held-out documents, so data without a validation split cannot be
    // trained on: the way out is more documents, not a zero fraction.
    ATOLL_CHECK(docs.size() >= 2,
                "the inputs hold {} document, but a validation split needs at least 2 (training "
                "evaluates on held-out documents): add text, or split it into documents with "
                "lines holding only \"%\" (the fortune format)",
                docs.size());
    n_val = std::clamp<size_t>(size_t(std::llround(opt.val_fraction * double(docs.size()))), 1,
                               docs.size() - 1);
  } else {
    log::warn("data: --val-fraction 0 writes no validation shards; `atoll train` needs them");
  }

  claim_output_dir(opt.out_dir);
  std::error_code ec;

  ShardSetWriter train(opt.out_dir, "train", size_t(opt.shard_tokens), token_bytes);
  ShardSetWriter val(opt.out_dir, "val", size_t(opt.shard_tokens), token_bytes);
  // Documents are encoded in parallel, a block at a time, and written in order: the shards do
  // not depend on the thread count.
  const int32_t eot = tok->eot();
  const size_t block = 4096;
  std::vector<std::vector<int32_t>> enc(std::min(block, order.size()));
  for (size_t k0 = 0; k0 < order.size(); k0 += block) {
    const int64_t n = int64_t(std::min(block, order.size() - k0));
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; ++i) enc[size_t(i)] = tok->encode(docs[order[k0 + size_t(i)]]);
    for (int64_t i = 0; i < n; ++i) {
      ShardSetWriter& w = k0 + size_t(i) < n_val ? val : train;
      w.add(&eot, 1);
      w.add(enc[size_t(i)]);
    }
  }
  auto shard_list = [&](const std::vector<std::string>& paths) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& p : paths) {
      ShardReader r(p);
      a.push_back({{"file", fs::path(p).filename().string()}, {"tokens", r.size()}});
    }
    return a;
  };
  nlohmann::json meta = {
      {"version", kMetaVersion},
      {"format", token_bytes == 2
                     ? "llm.c token shards: 256 x int32 header (magic 20240520, version 1), "
                       "uint16 tokens"
                     : "llm.c token shards: 256 x int32 header (magic 20240801, version 7), "
                       "uint32 tokens"},
      {"token_bytes", token_bytes},
      {"tokenizer", canonical_tokenizer_spec(opt.tokenizer)},
      {"tokenizer_name", tok->name()},
      {"tokenizer_fingerprint", tokenizer_fingerprint(opt.tokenizer)},
      {"vocab_size", tok->vocab_size()},
      {"eot", eot},
      {"inputs", inputs_json(files)},
      {"invalid_utf8_replaced", invalid_utf8},
      {"val_fraction", opt.val_fraction},
      {"shard_tokens", opt.shard_tokens},
      {"seed", opt.seed},
      {"documents", {{"train", docs.size() - n_val}, {"val", n_val}}},
      {"tokens", {{"train", train.total_tokens()}, {"val", val.total_tokens()}}},
      {"shards",
       {{"train", shard_list(train.finish())},
        {"val", n_val ? shard_list(val.finish()) : nlohmann::json::array()}}},
  };
  fs::path mp = fs::path(opt.out_dir) / "meta.json";
  {
    std::ofstream out(mp.string() + ".tmp");
    out << meta.dump(2) << "\n";
    out.close();
    ATOLL_CHECK(out.good(), "cannot write {}", mp.string());
  }
  fs::rename(mp.string() + ".tmp", mp, ec);
  ATOLL_CHECK(!ec, "cannot write {}: {}", mp.string(), ec.message());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::info("data: {} documents from {} files -> {} train + {} val tokens ({}) in {}, {:.2f} s",
            docs.size(), files.size(), train.total_tokens(), val.total_tokens(), tok->name(),
            opt.out_dir, secs);
  return meta;
}

std::vector<std::string> default_corpus_files(const std::string& dir_in) {
  std::string dir = dir_in.empty() ? kDefaultFortunes : dir_in;
  const char* install =
      "the default corpus is Debian's fortunes; install it with `sudo apt-get install fortunes "
      "fortunes-min` (or pass your own text with --input FILE...)";
  std::error_code ec;
  ATOLL_CHECK(fs::is_directory(dir, ec), "{} does not exist: {}", dir, install);
  std::vector<std::string> files;
  // Only the top level: the offensive fortunes live in off/ and are left out on purpose.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (e.is_symlink() || !e.is_regular_file() || n.empty() || n[0] == '.') continue;
    std::string ext = e.path().extension().string();
    if (ext == ".dat" || ext == ".u8") continue;
    files.push_back(fs::absolute(e.path()).lexically_normal().string());
  }
  ATOLL_CHECK(!files.empty(), "{} holds no fortune files: {}", dir, install);
  std::sort(files.begin(), files.end());
  return files;
}

nlohmann::json prepare_default_corpus(const std::string& out_dir,
                                      const std::string& tokenizer_spec) {
  PrepareOptions opt;
  opt.inputs = default_corpus_files();
  opt.tokenizer = tokenizer_spec;
  opt.out_dir = out_dir;
  if (prepared_data_matches(opt)) {
    log::info("data: {} is up to date (fortunes, tokenizer {})", out_dir, tokenizer_spec);
    return read_data_meta(out_dir);
  }
  return prepare_data(opt);
}

}  // namespace atl
