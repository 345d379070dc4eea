#include "cli/model_weights.h"

#include <filesystem>

#include "core/fileio.h"
#include "models/gpt/gpt_weights.h"
#include "resilience/checkpoint.h"

namespace atl::cli {

LoadedModel load_model(const std::string& weights, int64_t n_head) {
  namespace fs = std::filesystem;
  LoadedModel lm;
  ATOLL_CHECK(fs::exists(weights), "weights '{}' do not exist (a run directory, a checkpoint directory or a .safetensors file)",
              weights);
  lm.file = weights;
  if (fs::is_directory(weights)) {
    std::string ck = weights;
    if (fs::exists(fs::path(weights) / "checkpoints")) {
      auto p = CheckpointStore((fs::path(weights) / "checkpoints").string()).latest();
      ATOLL_CHECK(p.has_value(), "run directory '{}' has no complete checkpoint", weights);
      ck = *p;
    }
    CheckpointStore::verify(ck);
    lm.checkpoint = ck;
    lm.state = nlohmann::json::parse(read_file((fs::path(ck) / "state.json").string()));
    lm.file = (fs::path(ck) / "model.safetensors").string();
  }
  nn::GptWeights w = nn::gpt_weights(load_safetensors(lm.file), lm.file, n_head);
  lm.from_hf = w.from_hf;
  lm.model = std::make_unique<nn::GPT>(w.config);
  lm.model->load_state_dict(w.tensors, lm.file);
  return lm;
}

}  // namespace atl::cli
