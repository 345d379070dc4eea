// Shared by the launch tests of islands whose ranks hold parts of the model (test_islands_sharded,
// test_islands_pipeline): the islands fixture, and readers of checkpoints and sync records.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch_fixture.h"
#include "tensor/safetensors.h"

namespace atl::parallel::test {

// DiLoCo (H = 3) over 2 islands of gpt2-tiny (2 layers, its head tied to the token embedding),
// 6 steps of AdamW; train_extra: more [train] lines. Every run goes through `atoll launch`.
struct IslandsFixture : LaunchFixture {
  IslandsFixture(const std::string& tag, const std::string& train_extra = "")
      : LaunchFixture(tag,
                      "[model]\npreset = \"gpt2-tiny\"\nn_layer = 2\n"
                      "[train]\nsteps = 6\nbatch_size = 4\nseq_len = 32\nwarmup_steps = 2\nthreads = 1\n" +
                          train_extra +
                          "[optim.adamw]\nlr = 1e-2\n[eval]\nevery = 0\n[sample]\nevery = 0\n[checkpoint]\nevery = 0\n"
                          "keep = 100\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n"
                          "[parallel]\nislands = 2\n[lowcomm]\nmethod = \"diloco\"\ninner_steps = 3\n",
                      4244) {}
  int train(const std::string& run, int ranks, std::vector<std::string> extra, bool expect_fail = false) {
    return LaunchFixture::train(run, ranks, std::move(extra), expect_fail, /*always_launch=*/true);
  }
};

// The f32 tensors in file order; from an optimizer file, those named prefix + the model's name.
inline std::vector<float> tensors_of(const TensorFile& f, const std::string& prefix = "") {
  std::vector<float> v;
  for (auto& [n, t] : f.tensors)
    if (t.dtype() == DType::f32 && n.rfind(prefix, 0) == 0) {
      auto x = t.contiguous().to_vector();
      v.insert(v.end(), x.begin(), x.end());
    }
  return v;
}
inline TensorFile optim_of(const std::filesystem::path& ck) {
  return load_safetensors((ck / "optimizer.safetensors").string());
}
inline std::vector<float> model_of(const std::filesystem::path& ck) {
  return tensors_of(load_safetensors((ck / "model.safetensors").string()));
}
// Island 1's model as the checkpoint keeps it beside island 0's.
inline std::vector<float> island1_of(const std::filesystem::path& ck) {
  return tensors_of(optim_of(ck), "lowcomm.island1.model.");
}

// Each outer step's bytes (metrics.jsonl's sync records; key: wan_bytes for rank 0's, or wan_bytes_job).
inline std::vector<int64_t> wan_bytes_of(const std::filesystem::path& run, const char* key = "wan_bytes") {
  std::ifstream f(run / "metrics.jsonl");
  std::vector<int64_t> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty())
      if (auto j = nlohmann::json::parse(line); j.contains("sync")) out.push_back(j.at("sync").at(key).get<int64_t>());
  return out;
}

}  // namespace atl::parallel::test
