// atoll: the command line. Dispatches to the registered subcommands; every error a subcommand
// throws is printed as one line and exits 1.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli/command.h"
#include "core/config.h"
#include "core/error.h"

namespace atl::cli {

static std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
void register_command(Command c) { registry().push_back(std::move(c)); }
const std::vector<Command>& commands() { return registry(); }

static void usage() {
  std::printf("usage: atoll <command> [options]\n\ncommands:\n");
  for (const auto& c : commands()) std::printf("  %-18s %s\n", c.name.c_str(), c.help.c_str());
  std::printf("\n`atoll <command> --help` describes a command's options.\n");
}

}  // namespace atl::cli

int main(int argc, char** argv) {
  using namespace atl::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 1 : 0;
  }
  const Command* best = nullptr;
  int words = 0;
  for (const auto& c : commands()) {
    // Split the command's name into words and match them against argv[1..].
    int n = 0;
    size_t pos = 0;
    bool ok = true;
    while (pos <= c.name.size()) {
      size_t sp = c.name.find(' ', pos);
      std::string w = c.name.substr(pos, sp == std::string::npos ? std::string::npos : sp - pos);
      if (1 + n >= argc || w != argv[1 + n]) { ok = false; break; }
      ++n;
      if (sp == std::string::npos) break;
      pos = sp + 1;
    }
    if (ok && n > words) { best = &c; words = n; }
  }
  if (!best) {
    std::vector<std::string> names;
    for (const auto& c : commands()) names.push_back(c.name);
    std::fprintf(stderr, "atoll: unknown command '%s'; did you mean '%s'?\n", argv[1],
                 atl::nearest(argv[1], names).c_str());
    return 1;
  }
  std::string self = "atoll " + best->name;
  std::vector<char*> args;
  args.push_back(self.data());
  for (int i = 1 + words; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  try {
    return best->run(int(args.size()) - 1, args.data());
  } catch (const atl::Error& e) {
    std::fprintf(stderr, "atoll %s: error: %s\n", best->name.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atoll %s: internal error: %s\n", best->name.c_str(), e.what());
    return 2;
  }
}
