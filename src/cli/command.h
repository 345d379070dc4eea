// Subcommands of `atoll`. Each src/cli/cmd_*.cpp registers its commands with a static Registrar;
// a name may have two words ("bench gemm"), and the longest registered prefix of argv wins.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace atl::cli {

struct Command {
  std::string name;  // "train", "bench gemm", ...
  std::string help;  // one line for `atoll --help`
  // argv[0] is "atoll <name>", the rest are the command's own arguments.
  std::function<int(int argc, char** argv)> run;
};

void register_command(Command c);
const std::vector<Command>& commands();

struct Registrar {
  explicit Registrar(Command c) { register_command(std::move(c)); }
};

}  // namespace atl::cli
