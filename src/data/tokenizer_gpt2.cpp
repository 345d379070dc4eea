// GPT-2 byte-level BPE: file format and encoding (Radford et al. 2019; Sennrich et al. 2016).
// Facts taken from OpenAI's published encoder.py: the byte-to-unicode table, the merge loop
// (merge every occurrence of the lowest-ranked adjacent pair until no ranked pair remains).
#include "data/tokenizer_gpt2.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/fileio.h"
#include "data/bpe_pretokenize.h"

namespace atl {

namespace fs = std::filesystem;

static const char* kEot = "<|endoftext|>";

const std::array<uint32_t, 256>& gpt2_byte_to_unicode() {
  static const std::array<uint32_t, 256> table = [] {
    // Printable Latin-1 bytes keep their code point; the rest are shifted to 256, 257, ... in
    // byte order, so that no token is spelled with whitespace or control characters.
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

static void append_utf8(std::string* s, uint32_t cp) {
  if (cp < 0x80) {
    *s += char(cp);
  } else if (cp < 0x800) {
    *s += char(0xC0 | (cp >> 6));
    *s += char(0x80 | (cp & 0x3F));
  } else {
    *s += char(0xE0 | (cp >> 12));
    *s += char(0x80 | ((cp >> 6) & 0x3F));
    *s += char(0x80 | (cp & 0x3F));
  }
}

std::string gpt2_spell(std::string_view raw) {
  const auto& t = gpt2_byte_to_unicode();
  std::string s;
  for (char c : raw) append_utf8(&s, t[uint8_t(c)]);
  return s;
}

std::string gpt2_unspell(std::string_view spelled) {
  static const std::unordered_map<uint32_t, uint8_t> inverse = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    const auto& t = gpt2_byte_to_unicode();
    for (int b = 0; b < 256; ++b) m[t[b]] = uint8_t(b);
    return m;
  }();
  std::string raw;
  for (size_t i = 0; i < spelled.size();) {
    size_t len;
    uint32_t cp = decode_utf8(spelled, i, &len);
    auto it = inverse.find(cp);
    ATOLL_CHECK(it != inverse.end(),
                "token \"{}\" has a character (U+{:04X}) outside GPT-2's byte-to-unicode table; "
                "is this a GPT-2 format encoder.json/vocab.bpe?",
                spelled, cp);
    raw += char(it->second);
    i += len;
  }
  return raw;
}

static std::string missing_help(const std::string& what) {
  return fmt::format(
      "{}. A GPT-2 BPE tokenizer is a directory holding encoder.json and vocab.bpe (OpenAI GPT-2 "
      "format). Train one on your text with `atoll tokenizer train --input FILE... --vocab-size "
      "4096 --out DIR`, or copy GPT-2's own encoder.json and vocab.bpe (published with OpenAI's "
      "gpt-2 release and the openai-community/gpt2 model) into a directory; or use the tokenizer "
      "spec \"byte\", which needs no files",
      what);
}

BpeVocab read_gpt2_bpe(const std::string& dir_or_file) {
  fs::path p(dir_or_file);
  std::error_code ec;
  if (!fs::exists(p, ec))
    fail("{}", missing_help(fmt::format("tokenizer '{}' does not exist", dir_or_file)));
  fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path();
  if (dir.empty()) dir = ".";
  fs::path enc = dir / "encoder.json", bpe = dir / "vocab.bpe";
  for (const auto& f : {enc, bpe})
    if (!fs::is_regular_file(f, ec))
      fail("{}",
           missing_help(fmt::format("tokenizer '{}': {} is missing", dir_or_file, f.string())));

  return parse_gpt2_bpe(read_file(enc.string()), read_file(bpe.string()), enc.string(),
                        bpe.string());
}

BpeVocab parse_gpt2_bpe(std::string_view encoder_json, std::string_view vocab_bpe,
                        const std::string& enc_name, const std::string& bpe_name) {
  BpeVocab v;
  std::unordered_map<std::string, int32_t> id_of;  // raw bytes -> id
  {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(encoder_json);
    } catch (const std::exception& e) {
      fail("{}: not valid JSON ({})", enc_name, e.what());
    }
    ATOLL_CHECK(j.is_object() && !j.empty(), "{}: expected a JSON object mapping tokens to ids",
                enc_name);
    int64_t max_id = -1;
    for (auto& [k, val] : j.items()) {
      ATOLL_CHECK(val.is_number_integer(), "{}: the id of token \"{}\" is not an integer",
                  enc_name, k);
      int64_t id = val.get<int64_t>();
      ATOLL_CHECK(id >= 0 && id < (1 << 24), "{}: token \"{}\" has id {} outside [0, 2^24)",
                  enc_name, k, id);
      max_id = std::max(max_id, id);
    }
    v.tokens.assign(size_t(max_id + 1), std::string());
    std::vector<bool> used(size_t(max_id + 1), false);
    for (auto& [k, val] : j.items()) {
      int32_t id = val.get<int32_t>();
      ATOLL_CHECK(!used[size_t(id)], "{}: id {} is given to two tokens", enc_name, id);
      used[size_t(id)] = true;
      if (k == kEot) {
        v.eot = id;
        continue;
      }
      std::string raw = gpt2_unspell(k);
      ATOLL_CHECK(!raw.empty(), "{}: empty token", enc_name);
      ATOLL_CHECK(id_of.emplace(raw, id).second, "{}: token \"{}\" appears twice", enc_name, k);
      v.tokens[size_t(id)] = std::move(raw);
    }
    ATOLL_CHECK(v.eot >= 0,
                "{}: has no \"{}\" token; byte-level BPE needs it as the "
                "end-of-text id",
                enc_name, kEot);
    for (int b = 0; b < 256; ++b)
      ATOLL_CHECK(id_of.count(std::string(1, char(b))),
                  "{}: the single byte 0x{:02X} (spelled \"{}\") has no id; a byte-level BPE "
                  "vocabulary must contain all 256 bytes",
                  enc_name, b, gpt2_spell(std::string(1, char(b))));
  }
  {
    std::istringstream in{std::string(vocab_bpe)};
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line.rfind("#version", 0) == 0) continue;
      size_t sp = line.find(' ');
      ATOLL_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() &&
                      line.find(' ', sp + 1) == std::string::npos,
                  "{}:{}: expected a merge \"left right\", got \"{}\"", bpe_name, lineno, line);
      std::string a = gpt2_unspell(line.substr(0, sp)), b = gpt2_unspell(line.substr(sp + 1));
      auto ia = id_of.find(a), ib = id_of.find(b), iab = id_of.find(a + b);
      ATOLL_CHECK(ia != id_of.end() && ib != id_of.end() && iab != id_of.end(),
                  "{}:{}: merge \"{}\" uses or makes a token that encoder.json lacks; the two "
                  "files do not belong together",
                  bpe_name, lineno, line);
      v.merges.emplace_back(ia->second, ib->second);
    }
  }
  return v;
}

void write_gpt2_bpe(const BpeVocab& v, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ATOLL_CHECK(!ec, "cannot create tokenizer directory {}: {}", dir, ec.message());
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (int32_t(id) == v.eot)
      j[kEot] = id;
    else if (!v.tokens[id].empty())
      j[gpt2_spell(v.tokens[id])] = id;
  }
  fs::path enc = fs::path(dir) / "encoder.json", bpe = fs::path(dir) / "vocab.bpe";
  {
    std::ofstream out(enc);
    out << j.dump() << "\n";
    ATOLL_CHECK(out.good(), "cannot write {}", enc.string());
  }
  {
    std::ofstream out(bpe);
    out << "#version: 0.2\n";
    for (auto [a, b] : v.merges)
      out << gpt2_spell(v.tokens[size_t(a)]) << ' ' << gpt2_spell(v.tokens[size_t(b)]) << '\n';
    ATOLL_CHECK(out.good(), "cannot write {}", bpe.string());
  }
}

Gpt2BpeTokenizer::Gpt2BpeTokenizer(BpeVocab v, std::string name)
    : vocab_(std::move(v)), name_(std::move(name)) {
  ATOLL_CHECK(vocab_.eot >= 0 && size_t(vocab_.eot) < vocab_.tokens.size(),
              "BPE vocabulary has no end-of-text id");
  byte_id_.fill(-1);
  for (size_t id = 0; id < vocab_.tokens.size(); ++id)
    if (vocab_.tokens[id].size() == 1) byte_id_[uint8_t(vocab_.tokens[id][0])] = int32_t(id);
  for (int b = 0; b < 256; ++b)
    ATOLL_CHECK(byte_id_[b] >= 0, "BPE vocabulary lacks the single byte 0x{:02X}", b);
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t id = 0; id < vocab_.tokens.size(); ++id)
    if (!vocab_.tokens[id].empty() && int32_t(id) != vocab_.eot)
      id_of.emplace(vocab_.tokens[id], int32_t(id));
  merge_.reserve(vocab_.merges.size() * 2);
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    auto [a, b] = vocab_.merges[r];
    auto it = id_of.find(vocab_.tokens[size_t(a)] + vocab_.tokens[size_t(b)]);
    ATOLL_CHECK(it != id_of.end(), "BPE merge {} makes a token missing from the vocabulary", r);
    uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    merge_.emplace(key, std::make_pair(int32_t(r), it->second));  // first (lowest) rank wins
  }
}

std::unique_ptr<Gpt2BpeTokenizer> Gpt2BpeTokenizer::load(const std::string& dir_or_file) {
  return std::make_unique<Gpt2BpeTokenizer>(read_gpt2_bpe(dir_or_file),
                                            "bpe:" + canonical_tokenizer_spec(dir_or_file));
}

void Gpt2BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  const bool cacheable = word.size() <= 64;
  CacheShard& shard = cache_[std::hash<std::string_view>()(word) % kCacheShards];
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(std::string(word));
    if (it != shard.map.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> sym(word.size());
  for (size_t i = 0; i < word.size(); ++i) sym[i] = byte_id_[uint8_t(word[i])];
  std::vector<int32_t> next;
  while (sym.size() > 1) {
    int32_t best_rank = INT32_MAX, best_id = -1;
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      uint64_t key = (uint64_t(uint32_t(sym[i])) << 32) | uint32_t(sym[i + 1]);
      auto it = merge_.find(key);
      if (it != merge_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best_id = it->second.second;
        best_key = key;
      }
    }
    if (best_id < 0) break;
    int32_t a = int32_t(best_key >> 32), b = int32_t(uint32_t(best_key));
    next.clear();
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
        next.push_back(best_id);
        i += 2;
      } else {
        next.push_back(sym[i++]);
      }
    }
    sym.swap(next);
  }
  out->insert(out->end(), sym.begin(), sym.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() > (1u << 14)) shard.map.clear();
    shard.map.emplace(std::string(word), std::move(sym));
  }
}

std::vector<int32_t> Gpt2BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (std::string_view w : gpt2_pretokenize(text)) encode_word(w, &ids);
  return ids;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    ATOLL_CHECK(id >= 0 && id < vocab_size(), "{}: id {} is outside its vocabulary of {}", name_,
                id, vocab_size());
    if (id == vocab_.eot) {
      s += kEot;
      continue;
    }
    ATOLL_CHECK(!vocab_.tokens[size_t(id)].empty(), "{}: id {} is not assigned to any token", name_,
                id);
    s += vocab_.tokens[size_t(id)];
  }
  return s;
}

}  // namespace atl
