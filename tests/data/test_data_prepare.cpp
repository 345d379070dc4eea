// Corpus preparation: fortune-format splitting, shards + meta.json that decode back to the
// documents, the validation split, idempotence, and the default fortunes corpus.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

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
std::vector<std::string> decode_docs(const std::vector<uint16_t>& toks, const atl::Tokenizer& tok) {
  std::vector<std::string> out;
  std::vector<int32_t> cur;
  bool started = false;
  for (uint16_t t : toks) {
    if (t == tok.eot()) {
      if (started) out.push_back(tok.decode(cur));
      cur.clear();
      started = true;
    } else {
      cur.push_back(t);
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
  std::vector<uint16_t> train, val;
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

TEST(DataPrepare, RefusesVocabulariesTooLargeForUint16Shards) {
  std::string d = temp_dir("big");
  nlohmann::json enc = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) enc[atl::gpt2_spell(std::string(1, char(b)))] = b;
  enc["<|endoftext|>"] = 70000;
  std::ofstream(d + "/encoder.json") << enc.dump();
  std::ofstream(d + "/vocab.bpe") << "#version: 0.2\n";
  std::ofstream(d + "/text") << "hello\n";
  atl::PrepareOptions opt;
  opt.inputs = {d + "/text"};
  opt.out_dir = d + "/out";
  opt.tokenizer = d;
  try {
    atl::prepare_data(opt);
    FAIL() << "expected an error";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("uint16"), std::string::npos) << e.what();
  }
  try {
    atl::read_data_meta(opt.out_dir);
    FAIL() << "expected an error";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("atoll data prepare"), std::string::npos) << e.what();
  }
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
