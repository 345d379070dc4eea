// Registers the MoE family ([model] family = "moe") with the model registry.
#include "models/moe/moe_model.h"

namespace atl::nn {
namespace {

ModelRegistrar moe_family("moe", ModelFamily{
    [](Config& cfg, const std::string& section) -> std::unique_ptr<Model> {
      return std::make_unique<MoEModel>(MoEModelConfig::from_config(cfg, section));
    },
    [](const std::map<std::string, std::string>& md) -> std::unique_ptr<Model> {
      return std::make_unique<MoEModel>(MoEModelConfig::from_metadata(md));
    }});

}  // namespace
}  // namespace atl::nn
