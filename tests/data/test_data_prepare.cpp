// Corpus preparation: fortune-format splitting, shards + meta.json that decode back to the
// documents, the validation split, idempotence, and the default fortunes corpus.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "data/bpe_train.h"
#include "data/corpus.h"
#include "data/data_loader.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "data/tokenizer_gpt2.h"

namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& tag) {
  std::string d = ::testing::TempDir() + "atoll_prep_" + tag + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(DataPrepare, SplitsFortuneFiles) {
  auto docs = atl::split_documents("first\nfortune\n%\nsecond\n%\n%\n\nthird\r\n%\r\n");
  EXPECT_EQ(docs, (std::vector<std::string>{"first\nfortune\n", "second\n", "third\r\n"}));
  EXPECT_EQ(atl::split_documents("plain text\nno separators\n"),
            (std::vector<std::string>{"plain text\nno separators\n"}));
  EXPECT_EQ(atl::split_documents("100%\n% not alone\n"),
            (std::vector<std::string>{"100%\n% not alone\n"}));
}

// Splits a token stream at end-of-text ids and decodes each piece.
std::vector<std::string> decode_docs(const std::vector<uint32_t>& toks, const atl::Tokenizer& tok) {
  std::vector<std::string> out;
  std::vector<int32_t> cur;
  bool started = false;
  for (uint32_t t : toks) {
    if (int32_t(t) == tok.eot()) {
      if (started) out.push_back(tok.decode(cur));
      cur.clear();
      started = true;
    } else {
      cur.push_back(int32_t(t));
    }
  }
  if (started) out.push_back(tok.decode(cur));
  return out;
}

TEST(DataPrepare, ShardsDecodeBackToTheDocuments) {
  std::string d = temp_dir("docs");
  fs::create_directories(d + "/in/sub");
  std::vector<std::string> expect;
  {
    std::ofstream a(d + "/in/a");
    for (int i = 0; i < 40; ++i) {
      std::string doc = "fortune number " + std::to_string(i) + " — café\n";
      a << doc << "%\n";
      expect.push_back(doc);
    }
    std::ofstream(d + "/in/sub/b.txt") << "a plain file\n";
    expect.push_back("a plain file\n");
    std::ofstream(d + "/in/a.dat", std::ios::binary)
        << std::string("\0\0\x02\x01", 4);    // binary: skipped
    fs::create_symlink("a", d + "/in/a.u8");  // alias: skipped
  }
  atl::PrepareOptions opt;
  opt.inputs = {d + "/in"};
  opt.out_dir = d + "/out";
  opt.val_fraction = 0.1;
  opt.shard_tokens = 500;
  nlohmann::json meta = atl::prepare_data(opt);
  EXPECT_EQ(meta["documents"]["train"], 37);
  EXPECT_EQ(meta["documents"]["val"], 4);  // round(0.1 * 41)
  EXPECT_EQ(meta["vocab_size"], 257);
  EXPECT_EQ(meta["inputs"].size(), 2u);
  EXPECT_GT(meta["shards"]["train"].size(), 1u);  // 500-token shards

  auto tok = atl::load_tokenizer("byte");
  std::vector<uint32_t> train, val;
  size_t n_train = 0;
  for (const auto& s : meta["shards"]["train"]) {
    auto t = atl::read_shard(opt.out_dir + "/" + s["file"].get<std::string>());
    EXPECT_EQ(t.size(), s["tokens"].get<size_t>());
    train.insert(train.end(), t.begin(), t.end());
  }
  n_train = train.size();
  EXPECT_EQ(meta["tokens"]["train"].get<size_t>(), n_train);
  val = atl::read_shard(opt.out_dir + "/val_000000.bin");
  EXPECT_EQ(meta["tokens"]["val"].get<size_t>(), val.size());
  EXPECT_EQ(train.front(), tok->eot());
  auto got = decode_docs(train, *tok), got_val = decode_docs(val, *tok);
  EXPECT_EQ(got.size(), 37u);
  EXPECT_EQ(got_val.size(), 4u);
  got.insert(got.end(), got_val.begin(), got_val.end());
  std::sort(got.begin(), got.end());
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(got, expect);

  // The loader reads the result; both splits exist.
  atl::DataLoader tl(opt.out_dir, "train", 2, 8, 0, 1, 1);
  atl::DataLoader vl(opt.out_dir, "val", 1, 8, 0, 1, 1);
  EXPECT_EQ(tl.num_tokens(), n_train);
  EXPECT_NO_THROW(tl.validate_vocab(257));

  // Idempotence is recognised; another tokenizer or changed input is not a match.
  EXPECT_TRUE(atl::prepared_data_matches(opt));
  atl::PrepareOptions other = opt;
  other.val_fraction = 0.2;
  EXPECT_FALSE(atl::prepared_data_matches(other));
  std::ofstream(d + "/in/sub/b.txt", std::ios::app) << "more\n";
  EXPECT_FALSE(atl::prepared_data_matches(opt));
  fs::remove_all(d);
}

TEST(DataPrepare, BpeDataTracksTheTokenizerContent) {
  std::string d = temp_dir("bpe");
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "the number " + std::to_string(i % 17) + " is lucky today\n%\nno, it is not\n%\n";
  std::ofstream(d + "/corpus") << text;
  atl::BpeTrainOptions topt;
  topt.vocab_size = 280;
  atl::write_gpt2_bpe(atl::train_bpe(atl::read_documents({d + "/corpus"}), topt), d + "/tok");
  atl::PrepareOptions opt;
  opt.inputs = {d + "/corpus"};
  opt.out_dir = d + "/out";
  opt.tokenizer = d + "/tok";
  nlohmann::json meta = atl::prepare_data(opt);
  EXPECT_EQ(meta["vocab_size"], 280);
  EXPECT_EQ(meta["eot"], 279);
  auto tok = atl::load_tokenizer(d + "/tok");
  auto train = atl::read_shard(d + "/out/train_000000.bin");
  auto docs = decode_docs(train, *tok);
  ASSERT_FALSE(docs.empty());
  for (const auto& doc : docs)
    EXPECT_TRUE(doc.rfind("the number ", 0) == 0 || doc == "no, it is not\n") << doc;
  // BPE compresses this text well below one token per byte.
  EXPECT_LT(double(meta["tokens"]["train"].get<int64_t>() + meta["tokens"]["val"].get<int64_t>()),
            0.4 * double(text.size()));
  EXPECT_TRUE(atl::prepared_data_matches(opt));
  EXPECT_NO_THROW(atl::check_prepared_tokenizer(opt.out_dir, d + "/tok/"));
  EXPECT_THROW(atl::check_prepared_tokenizer(opt.out_dir, "byte"), atl::Error);
  topt.vocab_size = 270;  // retrained in place: the prepared data no longer matches
  atl::write_gpt2_bpe(atl::train_bpe(atl::read_documents({d + "/corpus"}), topt), d + "/tok");
  EXPECT_FALSE(atl::prepared_data_matches(opt));
  try {
    atl::check_prepared_tokenizer(opt.out_dir, d + "/tok");
    FAIL() << "expected an error";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("since changed on disk"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

// Vocabularies past 65536 ids (Llama 3's 128256, say) need uint32 shards: prepare writes llm.c's
// uint32 kind for them, and the ids above 65535 come back intact.
TEST(DataPrepare, VocabulariesAbove65536GetUint32Shards) {
  std::string d = temp_dir("big");
  nlohmann::json enc = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) enc[atl::gpt2_spell(std::string(1, char(b)))] = b;
  enc["<|endoftext|>"] = 70000;
  std::ofstream(d + "/encoder.json") << enc.dump();
  std::ofstream(d + "/vocab.bpe") << "#version: 0.2\n";
  std::ofstream(d + "/text") << "hello\n%\nworld\n%\nagain\n";
  atl::PrepareOptions opt;
  opt.inputs = {d + "/text"};
  opt.out_dir = d + "/out";
  opt.tokenizer = d;
  opt.val_fraction = 0.3;
  nlohmann::json meta = atl::prepare_data(opt);
  EXPECT_EQ(meta["vocab_size"], 70001);
  EXPECT_EQ(meta["token_bytes"], 4);
  atl::ShardReader r(opt.out_dir + "/train_000000.bin");
  EXPECT_EQ(r.token_bytes(), 4);
  EXPECT_EQ(r[0], 70000u);  // every document starts with end-of-text
  EXPECT_EQ(r.max_token(), 70000u);
  EXPECT_TRUE(atl::prepared_data_matches(opt));
  atl::DataLoader tl(opt.out_dir, "train", 1, 2, 0, 1, 1);
  EXPECT_NO_THROW(tl.validate_vocab(70001));
  EXPECT_THROW(tl.validate_vocab(70000), atl::Error);
  // The byte tokenizer's 257 ids still get llm.c's uint16 shards.
  atl::PrepareOptions small = opt;
  small.tokenizer = "byte";
  small.out_dir = d + "/small";
  EXPECT_EQ(atl::prepare_data(small)["token_bytes"], 2);
  EXPECT_EQ(atl::ShardReader(small.out_dir + "/train_000000.bin").token_bytes(), 2);
  fs::remove_all(d);
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const atl::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A binary file named as input is refused with its name and where the binary part starts, and
// nothing is written; it used to be tokenized silently.
TEST(DataPrepare, RefusesBinaryInputNamingTheFileAndOffset) {
  std::string d = temp_dir("binary");
  std::ofstream(d + "/img.png", std::ios::binary) << std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
  atl::PrepareOptions opt;
  opt.inputs = {d + "/img.png"};
  opt.out_dir = d + "/out";
  std::string m = error_of([&] { atl::prepare_data(opt); });
  EXPECT_NE(m.find("img.png is a binary file (a NUL byte at offset 8)"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(d + "/out/meta.json"));
  // NUL past the first 4 KiB (which a directory listing sniffs) is still caught at reading.
  fs::create_directories(d + "/dir");
  std::ofstream(d + "/dir/late.txt", std::ios::binary) << std::string(5000, 'a') + std::string(1, '\0');
  opt.inputs = {d + "/dir"};
  m = error_of([&] { atl::prepare_data(opt); });
  EXPECT_NE(m.find("late.txt is a binary file (a NUL byte at offset 5000)"), std::string::npos) << m;
  fs::remove_all(d);
}

// Invalid UTF-8 (Latin-1 text, say) is replaced by U+FFFD and counted, not passed through.
TEST(DataPrepare, InvalidUtf8IsReplacedAndCounted) {
  size_t n = 0, first = 0;
  EXPECT_EQ(atl::repair_utf8("caf\xE9!", &n, &first), "caf\xEF\xBF\xBD!");
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(first, 3u);
  EXPECT_EQ(atl::repair_utf8("\xC0\xAF", &n), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(atl::repair_utf8("\xED\xA0\x80", &n).size(), 9u);  // a UTF-16 surrogate
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(atl::repair_utf8("ok \xF0\x9F\x99\x82 \xE2\x82\xAC", &n), "ok \xF0\x9F\x99\x82 \xE2\x82\xAC");
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(atl::repair_utf8("end\xE2\x82", &n), "end\xEF\xBF\xBD\xEF\xBF\xBD");  // truncated
  EXPECT_EQ(n, 2u);

  std::string d = temp_dir("utf8");
  std::ofstream(d + "/latin1.txt", std::ios::binary) << "un caf\xE9 cr\xE8me\n%\ndeux\n%\ntrois\n";
  atl::PrepareOptions opt;
  opt.inputs = {d + "/latin1.txt"};
  opt.out_dir = d + "/out";
  opt.val_fraction = 0.3;
  nlohmann::json meta = atl::prepare_data(opt);
  EXPECT_EQ(meta["invalid_utf8_replaced"], 2);
  std::string all;
  for (const char* f : {"/out/train_000000.bin", "/out/val_000000.bin"})
    for (uint32_t t : atl::read_shard(d + f))
      if (t < 256) all += char(t);
  EXPECT_EQ(all.find('\xE9'), std::string::npos);
  EXPECT_NE(all.find("caf\xEF\xBF\xBD cr\xEF\xBF\xBDme"), std::string::npos);
  fs::remove_all(d);
}

// One document cannot give a validation split; the message says how to get one and never sends
// the user to --val-fraction 0 (data without a validation split is refused by training).
TEST(DataPrepare, OneDocumentSaysHowToGetAValidationSplit) {
  std::string d = temp_dir("onedoc");
  std::ofstream(d + "/one.txt") << "a single document without separators\n";
  atl::PrepareOptions opt;
  opt.inputs = {d + "/one.txt"};
  opt.out_dir = d + "/out";
  std::string m = error_of([&] { atl::prepare_data(opt); });
  EXPECT_NE(m.find("needs at least 2"), std::string::npos) << m;
  EXPECT_NE(m.find("\"%\""), std::string::npos) << m;
  EXPECT_EQ(m.find("--val-fraction 0"), std::string::npos) << m;
  // Data prepared without validation: the loader's message asks for a fraction above 0 and
  // 2 documents, the same way out.
  opt.val_fraction = 0;
  atl::prepare_data(opt);
  m = error_of([&] { atl::DataLoader(opt.out_dir, "val", 1, 4); });
  EXPECT_NE(m.find("--val-fraction above 0"), std::string::npos) << m;
  EXPECT_NE(m.find("at least 2 documents"), std::string::npos) << m;
  fs::remove_all(d);
}

// Shards atoll did not write (no meta.json, no .atoll-data marker) are never deleted or
// overwritten; the refusal says what to do. Atoll's own output is replaced as before.
TEST(DataPrepare, NeverDeletesShardsItDidNotWrite) {
  std::string d = temp_dir("foreign");
  fs::create_directories(d + "/mine");
  atl::write_shard(d + "/mine/train_000000.bin", std::vector<int32_t>{1, 2, 3});
  atl::write_shard(d + "/mine/val_000000.bin", std::vector<int32_t>{4, 5});
  const std::string before = slurp(d + "/mine/train_000000.bin");
  std::ofstream(d + "/text") << "one\n%\ntwo\n%\nthree\n";
  atl::PrepareOptions opt;
  opt.inputs = {d + "/text"};
  opt.out_dir = d + "/mine";
  opt.val_fraction = 0.3;
  std::string m = error_of([&] { atl::prepare_data(opt); });
  EXPECT_NE(m.find("2 token shard file(s) that atoll did not write (train_000000.bin, ...;"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("data.auto_prepare"), std::string::npos) << m;
  EXPECT_EQ(slurp(d + "/mine/train_000000.bin"), before);
  EXPECT_TRUE(fs::exists(d + "/mine/val_000000.bin"));
  EXPECT_FALSE(fs::exists(d + "/mine/meta.json"));

  // Its own output directory atoll prepares again, and again after an interrupted run (shards
  // and the marker but no meta.json).
  opt.out_dir = d + "/ours";
  atl::prepare_data(opt);
  EXPECT_TRUE(fs::exists(d + "/ours/.atoll-data"));
  fs::remove(d + "/ours/meta.json");
  EXPECT_NO_THROW(atl::prepare_data(opt));
  EXPECT_TRUE(fs::exists(d + "/ours/meta.json"));
  fs::remove_all(d);
}

TEST(DataPrepare, DefaultFortunesCorpusIsIdempotent) {
  // Debian's fortunes packages are a build requirement (scripts/setup.sh installs them).
  auto files = atl::default_corpus_files();
  EXPECT_GT(files.size(), 10u);
  for (const auto& f : files) {
    EXPECT_EQ(f.find("/off/"), std::string::npos) << f;
    EXPECT_NE(fs::path(f).extension(), ".dat");
    EXPECT_NE(fs::path(f).extension(), ".u8");
  }
  std::string d = temp_dir("fortunes") + "/data";
  nlohmann::json m1 = atl::prepare_default_corpus(d, "byte");
  EXPECT_GT(m1["tokens"]["train"].get<int64_t>(), 1'000'000);
  EXPECT_GT(m1["documents"]["val"].get<int64_t>(), 100);
  auto stamp = fs::last_write_time(d + "/meta.json");
  auto shard_stamp = fs::last_write_time(d + "/train_000000.bin");
  nlohmann::json m2 = atl::prepare_default_corpus(d, "byte");
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(fs::last_write_time(d + "/meta.json"), stamp);
  EXPECT_EQ(fs::last_write_time(d + "/train_000000.bin"), shard_stamp);
  EXPECT_THROW(atl::default_corpus_files("/nonexistent/fortunes"), atl::Error);
  fs::remove_all(fs::path(d).parent_path());
}

}  // namespace
