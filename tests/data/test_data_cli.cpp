// The `atoll tokenizer train`, `atoll tokenizer encode` and `atoll data prepare` commands, run as
// a user would run them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "data/corpus.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace {

namespace fs = std::filesystem;

// Runs a command line; returns its exit status and captured stdout+stderr.
int run(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(DataCli, TrainTokenizerThenPrepareData) {
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  ASSERT_TRUE(fs::exists(atoll)) << atoll;
  std::string d = ::testing::TempDir() + "atoll_cli_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  {
    std::ofstream f(d + "/corpus.txt");
    for (int i = 0; i < 300; ++i)
      f << "entry " << i % 13 << ": the cat sat on the mat, again and again\n%\n";
  }
  std::string out;
  ASSERT_EQ(run(atoll + " tokenizer train --input " + d + "/corpus.txt --vocab-size 280 --out " +
                    d + "/tok",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("vocab 280"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(d + "/tok/encoder.json"));
  EXPECT_TRUE(fs::exists(d + "/tok/vocab.bpe"));

  ASSERT_EQ(run(atoll + " tokenizer encode --tokenizer " + d + "/tok 'the cat sat'", &out), 0)
      << out;
  EXPECT_NE(out.find("tokens for 11 bytes"), std::string::npos) << out;

  ASSERT_EQ(run(atoll + " data prepare --input " + d + "/corpus.txt --tokenizer " + d +
                    "/tok --out " + d + "/data --val-fraction 0.1",
                &out),
            0)
      << out;
  nlohmann::json meta = atl::read_data_meta(d + "/data");
  EXPECT_EQ(meta["vocab_size"], 280);
  EXPECT_EQ(meta["documents"]["val"], 30);
  auto tok = atl::load_tokenizer(d + "/tok");
  auto val = atl::read_shard(d + "/data/val_000000.bin");
  ASSERT_FALSE(val.empty());
  EXPECT_EQ(int32_t(val[0]), tok->eot());
  std::vector<int32_t> first_doc;
  for (size_t i = 1; i < val.size() && int32_t(val[i]) != tok->eot(); ++i) first_doc.push_back(int32_t(val[i]));
  EXPECT_EQ(tok->decode(first_doc).rfind("entry ", 0), 0u);

  // A second run is a no-op; errors exit 1 with a message.
  ASSERT_EQ(run(atoll + " data prepare --input " + d + "/corpus.txt --tokenizer " + d +
                    "/tok --out " + d + "/data --val-fraction 0.1",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("up to date"), std::string::npos) << out;
  EXPECT_EQ(run(atoll + " data prepare --input " + d + "/corpus.txt --tokenizer " + d +
                    "/nothing --out " + d + "/data2",
                &out),
            1)
      << out;
  EXPECT_NE(out.find("atoll tokenizer train"), std::string::npos) << out;
  fs::remove_all(d);
}

// Vocabularies of 65536 ids and more are accepted by `tokenizer train` (it used to stop at 65536);
// a small corpus then supports fewer merges, which it says. `data prepare` refuses a binary input
// with its name and offset and notes replaced invalid UTF-8.
TEST(DataCli, LargeVocabulariesBinaryAndInvalidUtf8Input) {
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  std::string d = ::testing::TempDir() + "atoll_cli_big_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d + "/corpus.txt") << "some words and more words\n%\nother words\n";
  std::string out;
  EXPECT_EQ(run(atoll + " tokenizer train --input " + d + "/corpus.txt --vocab-size 70000 --out " + d +
                    "/tok",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("instead of 70000"), std::string::npos) << out;
  std::ofstream(d + "/blob.bin", std::ios::binary) << std::string("GIF89a\0\0", 8);
  EXPECT_EQ(run(atoll + " data prepare --input " + d + "/blob.bin --out " + d + "/data", &out), 1)
      << out;
  EXPECT_NE(out.find("blob.bin is a binary file (a NUL byte at offset 6)"), std::string::npos) << out;
  std::ofstream(d + "/latin1.txt", std::ios::binary) << "na\xEFve\n%\nsecond\n%\nthird\n";
  EXPECT_EQ(run(atoll + " data prepare --input " + d + "/latin1.txt --out " + d + "/data", &out), 0)
      << out;
  EXPECT_NE(out.find("1 byte(s) of invalid UTF-8"), std::string::npos) << out;
  fs::remove_all(d);
}

}  // namespace
