// `atoll train CONFIG.toml [--section.key=value ...] [--resume]`
#include <csignal>
#include <cstring>

#include "cli/command.h"
#include "core/config.h"
#include "core/log.h"
#include "train/stop_signals.h"
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
          "usage: atoll train CONFIG.toml [--section.key=value ...] [--resume | --overwrite]\n"
          "  Trains the model the config describes; any config key can be overridden on the command line.\n"
          "  --resume      continue from the run directory's newest complete checkpoint (bit-exact)\n"
          "  --overwrite   start a new run in a run directory that holds one (its files are moved to\n"
          "                RUN_DIR/old-<time>/; nothing is deleted)\n"
          "  --train.force=true   start even when the memory estimate exceeds what is available\n");
      return 0;
    }
    if (a == "--resume") resume = true;
    else if (a == "--overwrite") overrides.push_back("run.overwrite=true");
    else if (a.rfind("--", 0) == 0) {
      ATOLL_CHECK(a.find('=') != std::string::npos, "option '{}' needs a value: --section.key=value", a);
      overrides.push_back(a.substr(2));
    } else {
      ATOLL_CHECK(path.empty(), "more than one config file given ('{}' and '{}')", path, a);
      path = a;
    }
  }
  ATOLL_CHECK(!path.empty(), "usage: atoll train CONFIG.toml [--section.key=value ...] [--resume | --overwrite]");
  // A reader that goes away (`atoll train ... | head`) must not end training: printing fails, that is all.
  std::signal(SIGPIPE, SIG_IGN);
  route_stop_signals();  // before the first thread: a stop signal never lands inside a GEMM kernel
  Config cfg = Config::load(path);
  for (auto& o : overrides) cfg.set_override(o);
  Trainer trainer(cfg);
  TrainResult r = trainer.run(resume);
  if (r.final_step == r.start_step) return 0;  // nothing to train: the trainer said why
  log::info("done: step {} loss {:.4f}{}", r.final_step, r.final_loss,
            r.final_val_loss >= 0 ? fmt::format(" val loss {:.4f}", r.final_val_loss) : std::string());
  return 0;
}

Registrar reg({"train", "train a model from a TOML config (overrides: --section.key=value)", run_train});

}  // namespace
}  // namespace atl::cli
