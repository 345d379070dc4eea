#include <gtest/gtest.h>

#include "core/config.h"
#include "core/error.h"

using namespace atl;

TEST(Config, ReadsTypedValuesAndDefaults) {
  Config c = Config::parse("[train]\nsteps = 10\nlr = 3e-4\nname = \"x\"\nbf16 = true\n", "t.toml");
  EXPECT_EQ(c.get_int("train.steps", 1), 10);
  EXPECT_DOUBLE_EQ(c.get_float("train.lr", 0), 3e-4);
  EXPECT_EQ(c.get_string("train.name", ""), "x");
  EXPECT_TRUE(c.get_bool("train.bf16", false));
  EXPECT_EQ(c.get_int("train.missing", 7), 7);
  EXPECT_NO_THROW(c.finish());
}

TEST(Config, UnknownKeyNamesFileLineAndNearest) {
  Config c = Config::parse("[train]\nsteps = 10\nlearning_rat = 3e-4\n", "run.toml");
  c.get_int("train.steps", 1);
  c.get_float("train.learning_rate", 1e-3);
  try {
    c.finish();
    FAIL() << "finish() accepted an unknown key";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("run.toml:3"), std::string::npos) << m;
    EXPECT_NE(m.find("train.learning_rat'"), std::string::npos) << m;
    EXPECT_NE(m.find("train.learning_rate"), std::string::npos) << m;
  }
}

TEST(Config, WrongTypeAndRangeAreErrors) {
  Config c = Config::parse("[train]\nsteps = \"ten\"\nlr = -1.0\n", "run.toml");
  EXPECT_THROW(c.get_int("train.steps", 1), Error);
  try {
    c.get_float("train.lr", 1e-3, 0.0, 1.0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.toml:3"), std::string::npos) << e.what();
  }
}

TEST(Config, OverridesWinAndAreNamed) {
  Config c = Config::parse("[train]\nsteps = 10\n", "run.toml");
  c.set_override("--train.steps=20");
  c.set_override("model.name=gpt2");
  EXPECT_EQ(c.get_int("train.steps", 1), 20);
  EXPECT_EQ(c.get_string("model.name", ""), "gpt2");
  c.set_override("train.stepz=3");
  try {
    c.finish();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("command line"), std::string::npos) << e.what();
  }
}

TEST(Config, MalformedFileNamesLine) {
  try {
    Config::parse("[train]\nsteps = = 3\n", "bad.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.toml:2"), std::string::npos) << e.what();
  }
}
