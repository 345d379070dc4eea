// The generic registry: names register once, lookups of unknown names list the valid ones and
// suggest a close one, and a name from a config names its key and where it was set.
#include <gtest/gtest.h>

#include "core/config.h"
#include "core/registry.h"

using namespace atl;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Registry, LooksUpAndListsValidNamesOnError) {
  Registry<int> r("widget");
  r.add("alpha", 1);
  r.add("beta", 2);
  EXPECT_EQ(r.get("beta"), 2);
  EXPECT_TRUE(r.has("alpha"));
  EXPECT_EQ(r.names(), (std::vector<std::string>{"alpha", "beta"}));
  std::string e = error_of([&] { r.get("alpah"); });
  EXPECT_NE(e.find("unknown widget 'alpah'; valid: alpha, beta"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'alpha'"), std::string::npos) << e;
  e = error_of([&] { r.get("zzzzzzzz"); });
  EXPECT_NE(e.find("valid: alpha, beta"), std::string::npos) << e;
  EXPECT_EQ(e.find("did you mean"), std::string::npos) << "no suggestion for a name far from all: " << e;
  e = error_of([&] { r.add("alpha", 3); });
  EXPECT_NE(e.find("registered twice"), std::string::npos) << e;
}

TEST(Registry, ConfigLookupNamesTheKeyAndLine) {
  Registry<int> r("gadget");
  r.add("one", 1);
  Config cfg = Config::parse("[x]\n\nkind = \"two\"\n", "reg.toml");
  std::string e = error_of([&] { r.lookup(cfg, "x.kind", "one"); });
  EXPECT_NE(e.find("x.kind (reg.toml:3)"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown gadget 'two'; valid: one"), std::string::npos) << e;
  Config empty = Config::parse("", "empty.toml");
  EXPECT_EQ(r.lookup(empty, "x.kind", "one"), 1);
}
