// `atoll train CONFIG.toml [--section.key=value ...] [--resume]`
#include <cstring>

#include "cli/command.h"
#include "core/config.h"
#include "core/log.h"
#include "train/trainer.h"

namespace atl::cli {
namespace {

int run_train(int argc, char** argv) {
  std::string path;
  std::vector<std::string> overrides;
  bool resume = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: atoll train CONFIG.toml [--section.key=value ...] [--resume]\n"
          "  Trains the model the config describes; any config key can be overridden on the command line.\n"
          "  --resume   continue from the run directory's latest checkpoint (bit-exact)\n");
      return 0;
    }
    if (a == "--resume") resume = true;
    else if (a.rfind("--", 0) == 0) {
      ATOLL_CHECK(a.find('=') != std::string::npos, "option '{}' needs a value: --section.key=value", a);
      overrides.push_back(a.substr(2));
    } else {
      ATOLL_CHECK(path.empty(), "more than one config file given ('{}' and '{}')", path, a);
      path = a;
    }
  }
  ATOLL_CHECK(!path.empty(), "usage: atoll train CONFIG.toml [--section.key=value ...] [--resume]");
  Config cfg = Config::load(path);
  for (auto& o : overrides) cfg.set_override(o);
  Trainer trainer(cfg);
  TrainResult r = trainer.run(resume);
  log::info("done: step {} loss {:.4f}{}", r.final_step, r.final_loss,
            r.final_val_loss >= 0 ? fmt::format(" val loss {:.4f}", r.final_val_loss) : std::string());
  return 0;
}

Registrar reg({"train", "train a model from a TOML config (overrides: --section.key=value)", run_train});

}  // namespace
}  // namespace atl::cli
