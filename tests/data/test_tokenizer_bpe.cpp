// GPT-2 BPE loader on hand-written encoder.json/vocab.bpe files, and BPE training checked against
// a naive re-count of pair frequencies, for compression, round trips and the file format.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tensor/rng.h"
#include "data/bpe_pretokenize.h"
#include "data/bpe_train.h"
#include "data/tokenizer.h"
#include "data/tokenizer_gpt2.h"

namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& tag) {
  std::string d = ::testing::TempDir() + "atoll_bpe_" + tag + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(DataGpt2Bpe, ByteToUnicodeTableIsGpt2s) {
  const auto& t = atl::gpt2_byte_to_unicode();
  EXPECT_EQ(t['!'], uint32_t('!'));
  EXPECT_EQ(t['~'], uint32_t('~'));
  EXPECT_EQ(t[' '], 0x120u);   // "Ġ"
  EXPECT_EQ(t['\n'], 0x10Au);  // "Ċ"
  EXPECT_EQ(t[0], 0x100u);
  EXPECT_EQ(t[127], 0x121u);
  EXPECT_EQ(t[173], 0x143u);  // "Ń"
  EXPECT_EQ(t[0xE9], 0xE9u);
  EXPECT_EQ(atl::gpt2_spell(" hi\n"), "\xC4\xA0hi\xC4\x8A");
  EXPECT_EQ(atl::gpt2_unspell("\xC4\xA0hi\xC4\x8A"), " hi\n");
}

// A tiny GPT-2-format tokenizer: the 256 bytes in GPT-2's id order, then ten merges.
std::string write_tiny_gpt2(const std::string& dir, bool swap_first_two = false) {
  nlohmann::ordered_json enc = nlohmann::ordered_json::object();
  std::vector<std::pair<uint32_t, int>> by_cp;
  for (int b = 0; b < 256; ++b) by_cp.push_back({atl::gpt2_byte_to_unicode()[size_t(b)], b});
  std::sort(by_cp.begin(), by_cp.end());
  int id = 0;
  for (auto [cp, b] : by_cp) enc[atl::gpt2_spell(std::string(1, char(b)))] = id++;
  std::vector<std::string> merges = {"l l",           "e l",           "h e", "he ll",
                                     "hell o",        "\xC4\xA0 w",    "o r", "\xC4\xA0w or",
                                     "\xC4\xA0wor l", "\xC4\xA0worl d"};
  if (swap_first_two) std::swap(merges[0], merges[1]);
  for (const auto& m : merges) {
    std::string joined = m;
    joined.erase(joined.find(' '), 1);
    enc[joined] = id++;
  }
  enc["<|endoftext|>"] = id;
  std::ofstream(dir + "/encoder.json") << enc.dump();
  std::ofstream bpe(dir + "/vocab.bpe");
  bpe << "#version: 0.2\n";
  for (const auto& m : merges) bpe << m << "\n";
  return dir;
}

TEST(DataGpt2Bpe, KnownMergeSequences) {
  std::string dir = write_tiny_gpt2(temp_dir("tiny"));
  auto tok = atl::load_tokenizer(dir);
  // Ids: bytes at GPT-2's positions ('h' = 71, 's' = 82, 'e' = 68 as in GPT-2), merges 256..265.
  const int h = 71, s = 82, e = 68, ll = 256, el = 257, hell = 259, hello = 260, world = 265;
  EXPECT_EQ(tok->vocab_size(), 267);
  EXPECT_EQ(tok->eot(), 266);
  EXPECT_EQ(tok->encode("h"), (std::vector<int32_t>{h}));
  EXPECT_EQ(tok->encode("hello world"), (std::vector<int32_t>{hello, world}));
  // "ell": (l,l) has rank 0, (e,l) rank 1, so e + ll.
  EXPECT_EQ(tok->encode("ell"), (std::vector<int32_t>{e, ll}));
  // "shell": ll, then he, then hell.
  EXPECT_EQ(tok->encode("shell"), (std::vector<int32_t>{s, hell}));
  EXPECT_EQ(tok->decode({hello, world, 266}), "hello world<|endoftext|>");
  (void)el;

  // With the first two ranks swapped, "ell" becomes el + l: ranks, not file positions of the
  // vocabulary, decide.
  std::string dir2 = write_tiny_gpt2(temp_dir("tiny_swapped"), true);
  auto tok2 = atl::load_tokenizer(dir2 + "/encoder.json");
  const int el2 = 256, l = 75;
  EXPECT_EQ(tok2->encode("ell"), (std::vector<int32_t>{el2, l}));
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

TEST(DataGpt2Bpe, EncodeDecodeRoundTrips) {
  std::string dir = write_tiny_gpt2(temp_dir("rt"));
  auto tok = atl::load_tokenizer(dir);
  for (std::string text :
       {std::string("hello world, hello shell!\n\n  tabs\tand 123"), std::string("café 日本語 — ½"),
        std::string("bad \xff\xfe utf8 \xc3"), std::string("")}) {
    auto ids = tok->encode(text);
    EXPECT_EQ(tok->decode(ids), text);
    EXPECT_EQ(tok->encode(tok->decode(ids)), ids);
    for (int32_t id : ids) EXPECT_LT(id, tok->vocab_size());
  }
  fs::remove_all(dir);
}

TEST(DataGpt2Bpe, BrokenFilesAreReported) {
  std::string dir = write_tiny_gpt2(temp_dir("broken"));
  {
    std::ofstream bpe(dir + "/vocab.bpe", std::ios::app);
    bpe << "q z\n";  // "qz" is not in encoder.json
  }
  try {
    atl::load_tokenizer(dir);
    FAIL() << "expected an error";
  } catch (const atl::Error& err) {
    EXPECT_NE(std::string(err.what()).find("do not belong together"), std::string::npos)
        << err.what();
  }
  fs::remove(dir + "/vocab.bpe");
  try {
    atl::load_tokenizer(dir);
    FAIL() << "expected an error";
  } catch (const atl::Error& err) {
    std::string m = err.what();
    EXPECT_NE(m.find("vocab.bpe is missing"), std::string::npos) << m;
    EXPECT_NE(m.find("atoll tokenizer train"), std::string::npos) << m;
  }
  fs::remove_all(dir);
}

// Deterministic pseudo-English text from a small word list.
std::vector<std::string> make_corpus(int docs, uint64_t seed) {
  const char* words[] = {"the",    "quick",   "brown",    "fox",   "jumps", "over",  "lazy",
                         "dog",    "and",     "then",     "runs",  "away",  "from",  "hunter",
                         "who",    "was",     "sleeping", "under", "tree",  "near",  "river",
                         "bank",   "while",   "birds",    "sang",  "songs", "about", "summer",
                         "rain",   "falling", "softly",   "on",    "roofs", "of",    "old",
                         "houses", "in",      "village",  "42",    "1999",  "it's",  "they're"};
  const size_t nw = sizeof(words) / sizeof(words[0]);
  atl::Rng rng(seed, 0);
  std::vector<std::string> out;
  for (int d = 0; d < docs; ++d) {
    std::string s;
    int n = 5 + int(rng.below(20));
    for (int i = 0; i < n; ++i) {
      if (i) s += rng.below(10) == 0 ? ", " : " ";
      s += words[rng.below(nw)];
    }
    s += rng.below(3) == 0 ? "!\n" : ".\n";
    out.push_back(s);
  }
  return out;
}

// Textbook BPE: recount every pair over all words after each merge.
std::vector<std::pair<std::string, std::string>> naive_bpe(const std::vector<std::string>& docs,
                                                           int n_tokens) {
  std::map<std::string, int64_t> counts;
  for (const auto& d : docs)
    for (auto w : atl::gpt2_pretokenize(d)) ++counts[std::string(w)];
  std::vector<std::pair<std::vector<std::string>, int64_t>> words;
  for (auto& [w, c] : counts) {
    std::vector<std::string> syms;
    for (char ch : w) syms.push_back(std::string(1, ch));
    words.push_back({syms, c});
  }
  // Ties go to the smaller (left id, right id); ids follow creation order, bytes in GPT-2 order.
  std::map<std::string, int> id;
  {
    std::vector<std::pair<uint32_t, int>> by_cp;
    for (int b = 0; b < 256; ++b) by_cp.push_back({atl::gpt2_byte_to_unicode()[size_t(b)], b});
    std::sort(by_cp.begin(), by_cp.end());
    for (auto [cp, b] : by_cp) id[std::string(1, char(b))] = int(id.size());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  while (int(id.size()) < n_tokens) {
    std::map<std::pair<int, int>, int64_t> pc;
    for (auto& [syms, c] : words)
      for (size_t i = 0; i + 1 < syms.size(); ++i) pc[{id[syms[i]], id[syms[i + 1]]}] += c;
    std::pair<int, int> best{-1, -1};
    int64_t best_c = 0;
    for (auto& [p, c] : pc)
      if (c > best_c) {
        best_c = c;
        best = p;
      }
    if (best_c < 2) break;
    std::string a, b;
    for (auto& [s, i] : id) {
      if (i == best.first) a = s;
      if (i == best.second) b = s;
    }
    merges.push_back({a, b});
    if (!id.count(a + b)) {
      int next = int(id.size());
      id[a + b] = next;
    }
    for (auto& [syms, c] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < syms.size();) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          out.push_back(a + b);
          i += 2;
        } else {
          out.push_back(syms[i++]);
        }
      }
      syms = out;
    }
  }
  return merges;
}

TEST(DataBpeTrain, MatchesNaiveRecountingBpe) {
  auto docs = make_corpus(150, 7);
  atl::BpeTrainOptions opt;
  opt.vocab_size = 257 + 60;
  atl::BpeVocab v = atl::train_bpe(docs, opt);
  auto ref = naive_bpe(docs, 257 + 60 - 1);
  ASSERT_EQ(v.merges.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(v.tokens[size_t(v.merges[i].first)], ref[i].first) << "merge " << i;
    EXPECT_EQ(v.tokens[size_t(v.merges[i].second)], ref[i].second) << "merge " << i;
  }
}

TEST(DataBpeTrain, CompressesRoundTripsAndReloads) {
  auto docs = make_corpus(3000, 11);
  atl::BpeTrainOptions opt;
  opt.vocab_size = 400;
  atl::BpeVocab v = atl::train_bpe(docs, opt);
  EXPECT_EQ(v.tokens.size(), 400u);
  EXPECT_GE(v.merges.size(), 400u - 257u);
  EXPECT_EQ(v.eot, 399);
  // Determinism: the same corpus gives the same merges.
  atl::BpeVocab v2 = atl::train_bpe(docs, opt);
  EXPECT_EQ(v.merges, v2.merges);

  atl::Gpt2BpeTokenizer mem(v);
  size_t bytes = 0, ntok = 0;
  for (const auto& d : docs) {
    auto ids = mem.encode(d);
    bytes += d.size();
    ntok += ids.size();
    ASSERT_EQ(mem.decode(ids), d);
  }
  double ratio = double(bytes) / double(ntok);
  // 143 merges cover most of a 42-word vocabulary: most words become one token.
  EXPECT_GT(ratio, 3.0) << "bytes per token";

  std::string dir = temp_dir("trained");
  atl::write_gpt2_bpe(v, dir);
  auto loaded = atl::load_tokenizer(dir);
  EXPECT_EQ(loaded->vocab_size(), 400);
  EXPECT_EQ(loaded->eot(), 399);
  std::string unseen = "The fox — a café owner — paid ½ of 1999 dollars! ¿Qué? \xff\n";
  EXPECT_EQ(loaded->decode(loaded->encode(unseen)), unseen);
  for (const auto& d : {docs[0], docs[1], docs[2], unseen})
    EXPECT_EQ(loaded->encode(d), mem.encode(d));
  // The first 256 ids are GPT-2's byte ids.
  EXPECT_EQ(loaded->encode("!"), (std::vector<int32_t>{0}));
  EXPECT_EQ(loaded->encode("h"), (std::vector<int32_t>{71}));
  fs::remove_all(dir);
}

TEST(DataBpeTrain, RejectsTinyVocab) {
  atl::BpeTrainOptions opt;
  opt.vocab_size = 200;
  EXPECT_THROW(atl::train_bpe({"abc"}, opt), atl::Error);
}

}  // namespace
