#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace atl::log {
namespace {
Level g_level = [] {
  const char* e = std::getenv("ATOLL_LOG");
  if (!e) return Level::info;
  std::string s(e);
  if (s == "debug") return Level::debug;
  if (s == "warn") return Level::warn;
  if (s == "error") return Level::error;
  return Level::info;
}();
int g_rank = -1;
std::mutex g_mu;
}  // namespace

void set_level(Level l) { g_level = l; }
Level level() { return g_level; }
void set_rank(int rank) { g_rank = rank; }

void write(Level l, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lk(g_mu);
  FILE* out = l >= Level::warn ? stderr : stdout;
  if (l == Level::info) {
    if (g_rank >= 0) std::fprintf(out, "[rank %d] %s\n", g_rank, msg.c_str());
    else std::fprintf(out, "%s\n", msg.c_str());
  } else {
    if (g_rank >= 0) std::fprintf(out, "[rank %d] %s: %s\n", g_rank, names[int(l)], msg.c_str());
    else std::fprintf(out, "%s: %s\n", names[int(l)], msg.c_str());
  }
  std::fflush(out);
}

}  // namespace atl::log
