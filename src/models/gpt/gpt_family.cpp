// Registers the GPT family ([model] family = "gpt", the default) with the model registry.
#include "models/gpt/gpt.h"

namespace atl::nn {
namespace {

ModelRegistrar gpt_family("gpt", ModelFamily{
    [](Config& cfg, const std::string& section) -> std::unique_ptr<Model> {
      return std::make_unique<GPT>(GPTConfig::from_config(cfg, section));
    },
    [](const std::map<std::string, std::string>& md) -> std::unique_ptr<Model> {
      return std::make_unique<GPT>(config_from_metadata(md));
    }});

}  // namespace
}  // namespace atl::nn
