// Byte tokenizer, the tokenizer factory, and the GPT-2 pre-tokenizer checked against GPT-2's regex
// run by Python (tools/gpt2_pretokenize_ref.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/bpe_pretokenize.h"
#include "data/tokenizer.h"

namespace {

namespace fs = std::filesystem;

std::string join(const std::vector<std::string_view>& v) {
  std::string s;
  for (auto p : v) s += p;
  return s;
}

TEST(DataByteTokenizer, RoundTripsEveryByte) {
  auto tok = atl::load_tokenizer("byte");
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eot(), 256);
  EXPECT_EQ(tok->name(), "byte");
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  auto ids = tok->encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[size_t(b)], b);
  EXPECT_EQ(tok->decode(ids), all);
  EXPECT_EQ(tok->decode({104, 105, 256}), "hi<|endoftext|>");
  EXPECT_THROW(tok->decode({257}), atl::Error);
}

TEST(DataByteTokenizer, MissingBpeDirectorySaysHowToGetOne) {
  try {
    atl::load_tokenizer("/nonexistent/tokenizer-dir");
    FAIL() << "expected an error";
  } catch (const atl::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("atoll tokenizer train"), std::string::npos) << m;
    EXPECT_NE(m.find("encoder.json"), std::string::npos) << m;
  }
}

TEST(DataPretokenize, HandPickedCases) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(atl::gpt2_pretokenize("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(atl::gpt2_pretokenize("it's   3.14!!\n"),
            (V{"it", "'s", "  ", " 3", ".", "14", "!!", "\n"}));
  EXPECT_EQ(atl::gpt2_pretokenize("we'll   go"), (V{"we", "'ll", "  ", " go"}));
  EXPECT_EQ(atl::gpt2_pretokenize(""), V{});
  EXPECT_EQ(atl::gpt2_pretokenize(" "), V{" "});
  // Invalid UTF-8 still splits into pieces that concatenate back to the input.
  std::string bad = "ab\xff\xfe cd\xc3";
  EXPECT_EQ(join(atl::gpt2_pretokenize(bad)), bad);
}

TEST(DataPretokenize, MatchesGpt2RegexInPython) {
  std::string text =
      "Hello world's  test\n\n  x 123abc ?!'s café ÀÉ naïve 日本語 ½ ² — “quoted” \t\n"
      "I'M here; they'RE, you've, she'd, we'll 'tis\r\n"
      "  leading spaces,\ttabs\t\tand trailing   \n"
      "Numbers: 1,000,000 and 3.14159 or 2nd 10x.\n"
      "Ünïcödé Ελληνικά кириллица العربية हिन्दी\n"
      "Symbols: <|endoftext|> $100 @user #tag a+b=c ~/path/to/file.txt\n"
      "%\n\n\n";
  std::string dir = ::testing::TempDir() + "atoll_pretok_" + std::to_string(::getpid());
  fs::create_directories(dir);
  std::string in = dir + "/in.txt", out = dir + "/out.json";
  std::ofstream(in) << text;
  std::string cmd = std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR +
                    "/tools/gpt2_pretokenize_ref.py " + in + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  auto ref = nlohmann::json::parse(f).get<std::vector<std::string>>();
  auto got = atl::gpt2_pretokenize(text);
  std::vector<std::string> got_s(got.begin(), got.end());
  EXPECT_EQ(got_s, ref);
  EXPECT_EQ(join(got), text);
  fs::remove_all(dir);
}

}  // namespace
