// Where `atoll sample` and `atoll eval` find a model: a run directory (its latest complete
// checkpoint), a checkpoint (step) directory, or a safetensors file, atoll's own or a plain
// Hugging Face GPT-2 file (models/gpt/gpt_weights.h).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "models/gpt/gpt.h"

namespace atl::cli {

struct LoadedModel {
  std::unique_ptr<nn::GPT> model;
  std::string file;        // the safetensors file read
  std::string checkpoint;  // its checkpoint directory, when it came from one (verified)
  nlohmann::json state;    // that checkpoint's state.json, else null
  bool from_hf = false;
};

// n_head: for Hugging Face files only (0: n_embd / 64).
LoadedModel load_model(const std::string& weights, int64_t n_head = 0);

}  // namespace atl::cli
