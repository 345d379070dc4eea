// `atoll eval` and `atoll sample` run as a user runs them, on a checkpoint the trainer wrote:
// eval repeats the trainer's logged validation loss, reads a plain Hugging Face GPT-2 file, and
// sample refuses bad settings naming the flag.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "tensor/safetensors.h"
#include "data/corpus.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace atl;
namespace fs = std::filesystem;

namespace {

int run(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const std::string& atoll() {
  static const std::string a = std::string(ATOLL_BINARY_DIR) + "/atoll";
  return a;
}

// One tiny training run shared by the tests: 8 steps, evaluation and a checkpoint every 4.
struct TrainedRun {
  fs::path root, data, run;
  std::map<int64_t, double> val_loss;  // step -> val_loss from metrics.jsonl
};

const TrainedRun& trained() {
  static TrainedRun r = [] {
    TrainedRun r;
    r.root = fs::temp_directory_path() / ("atoll_eval_cli_" + std::to_string(::getpid()));
    fs::remove_all(r.root);
    fs::create_directories(r.root);
    r.data = test::make_data(r.root);
    r.run = r.root / "run";
    Config cfg = Config::parse(fmt::format(R"(
[run]
dir = "{}"
[data]
dir = "{}"
auto_prepare = false
[model]
preset = "gpt2-tiny"
[train]
steps = 8
batch_size = 4
seq_len = 32
warmup_steps = 2
threads = 2
[optim.adamw]
lr = 1e-2
[eval]
every = 4
steps = 3
[sample]
every = 0
[checkpoint]
every = 4
keep = 3
[log]
every = 100
[hardware]
peak_gflops = 100.0
)",
                                           r.run.string(), r.data.string()),
                               "eval_cli.toml");
    Trainer(cfg).run(false);
    std::ifstream m(r.run / "metrics.jsonl");
    for (std::string line; std::getline(m, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("val_loss")) r.val_loss[j["step"].get<int64_t>()] = j["val_loss"].get<double>();
    }
    return r;
  }();
  return r;
}

// The shared run's directory goes when the test program ends.
struct Cleanup : ::testing::Environment {
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("atoll_eval_cli_" + std::to_string(::getpid())), ec);
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new Cleanup);

double eval_json(const std::string& args, std::string* out) {
  // The trainer ran with 2 threads; so does eval (the kernels' results do not depend on the thread
  // count, but nothing is gained by leaving it to the machine).
  int rc = run("OMP_NUM_THREADS=2 " + atoll() + " eval " + args + " --json", out);
  EXPECT_EQ(rc, 0) << *out;
  if (rc != 0) return NAN;
  return nlohmann::json::parse(out->substr(out->find('{'))).at("loss").get<double>();
}

// Same weights, same batches, same kernels: the loss is the trainer's to the last bit on one
// machine. The bound leaves room only for printing/parsing a double (it round-trips) and would
// catch any other batch, row count or weight.
constexpr double kSameLoss = 1e-12;

fs::path checkpoint(const TrainedRun& r, int64_t step) { return r.run / "checkpoints" / fmt::format("step_{:08d}", step); }

TEST(EvalCli, CheckpointLossEqualsTrainersValLoss) {
  const TrainedRun& r = trained();
  ASSERT_TRUE(r.val_loss.count(4) && r.val_loss.count(8)) << "metrics.jsonl has no val_loss at steps 4 and 8";
  std::string out;
  for (int64_t step : {4, 8}) {
    fs::path ck = checkpoint(r, step);
    ASSERT_TRUE(fs::exists(ck / "state.json")) << ck;
    double l = eval_json(ck.string() + " --data " + r.data.string(), &out);
    EXPECT_NEAR(l, r.val_loss.at(step), kSameLoss * r.val_loss.at(step)) << "step " << step << ": " << out;
  }
  // A run directory means its latest checkpoint (step 8); the text output names loss and perplexity.
  double l = eval_json(r.run.string() + " --data " + r.data.string(), &out);
  EXPECT_NEAR(l, r.val_loss.at(8), kSameLoss * r.val_loss.at(8)) << out;
  ASSERT_EQ(run(atoll() + " eval " + r.run.string() + " --data " + r.data.string(), &out), 0) << out;
  EXPECT_NE(out.find("perplexity"), std::string::npos) << out;
  EXPECT_NE(out.find("3 batches of 4x32"), std::string::npos) << out;
  // Other batches give another loss: the match above is not an accident of the data.
  double other = eval_json(r.run.string() + " --data " + r.data.string() + " --steps 1 --batch-size 2", &out);
  EXPECT_GT(std::fabs(other - r.val_loss.at(8)), 1e-6) << out;
}

TEST(EvalCli, PlainHuggingFaceFileLoads) {
  // The step-8 weights rewritten as Hugging Face's GPT2Model saves them: no "transformer."
  // prefix, no atoll metadata, the causal-mask buffers, and an explicit copy of the tied head.
  const TrainedRun& r = trained();
  TensorFile tf = load_safetensors((checkpoint(r, 8) / "model.safetensors").string());
  std::vector<std::pair<std::string, Tensor>> hf;
  const Tensor* wte = nullptr;
  for (auto& [n, t] : tf.tensors) {
    ASSERT_EQ(n.rfind("transformer.", 0), 0u) << n;
    hf.emplace_back(n.substr(12), t);
    if (n == "transformer.wte.weight") wte = &t;
  }
  ASSERT_NE(wte, nullptr);
  for (int l = 0; l < 2; ++l) hf.emplace_back(fmt::format("h.{}.attn.bias", l), Tensor::full({1, 1, 64, 64}, 1.0f));
  hf.emplace_back("lm_head.weight", *wte);
  fs::path file = r.root / "hf_model.safetensors";
  save_safetensors(file.string(), hf, {{"format", "pt"}});

  // Same batches as the trainer's evaluation, given explicitly (a plain file records none).
  const std::string batches = " --data " + r.data.string() + " --batch-size 4 --seq-len 32 --steps 3";
  std::string out;
  double l = eval_json(file.string() + " --n-head 4" + batches, &out);
  EXPECT_NEAR(l, r.val_loss.at(8), kSameLoss * r.val_loss.at(8)) << out;
  ASSERT_EQ(run(atoll() + " eval " + file.string() + " --n-head 4" + batches, &out), 0) << out;
  EXPECT_NE(out.find("Hugging Face GPT-2"), std::string::npos) << out;
  EXPECT_NE(out.find("L=2 d=64 heads=4/4"), std::string::npos) << out;
  // Without --n-head, GPT-2's 64-wide heads give 1 head here: a different (wrong) model, but it loads.
  EXPECT_GT(std::fabs(eval_json(file.string() + batches, &out) - r.val_loss.at(8)), 1e-6) << out;

  // A file that is neither: refused naming what is missing.
  fs::path bad = r.root / "not_gpt2.safetensors";
  save_safetensors(bad.string(), {{"foo", Tensor::zeros({2, 2})}});
  EXPECT_EQ(run(atoll() + " eval " + bad.string() + batches, &out), 1) << out;
  EXPECT_NE(out.find("not a Hugging Face GPT-2 file"), std::string::npos) << out;
}

TEST(SampleCli, BadSettingsAreRefusedNamingTheFlag) {
  const TrainedRun& r = trained();
  const std::string w = atoll() + " sample --weights " + r.run.string();
  struct Bad {
    const char* args;
    const char* says;
  } bad[] = {{"--tokens -5", "--tokens must be 0 or more"},
             {"--temperature -1", "--temperature must be 0 (greedy) or positive"},
             {"--temperature nan", "--temperature must be"},
             {"--top-k -3", "--top-k must be 0 (no limit) or positive"},
             {"--top-p 0", "--top-p must be in (0, 1]"},
             {"--top-p 1.5", "--top-p must be in (0, 1]"},
             {"--top-p -0.2", "--top-p must be in (0, 1]"},
             {"--stop -1", "--stop token ids must be 0 or more"}};
  std::string out;
  for (const Bad& b : bad) {
    EXPECT_EQ(run(w + " " + b.args, &out), 1) << b.args << ": " << out;
    EXPECT_NE(out.find(b.says), std::string::npos) << b.args << ": " << out;
  }
}

TEST(SampleCli, CachedAndRecomputedTextAreTheSame) {
  // Through the command: greedy and seeded sampling, two prompts in one batch, 80 tokens (past the
  // tiny model's 64-token context, so the context shift runs too). One thread: see test_generate.cpp.
  const TrainedRun& r = trained();
  const std::string w = "OMP_NUM_THREADS=1 " + atoll() + " sample --weights " + r.run.string() + " -p 'the island' -p 'many ranks and' -n 80";
  for (const char* s : {" --temperature 0", " --temperature 0.9 --top-k 20 --top-p 0.9 --seed 3"}) {
    std::string cached, full;
    ASSERT_EQ(run(w + s, &cached), 0) << cached;
    ASSERT_EQ(run(w + s + " --no-cache", &full), 0) << full;
    EXPECT_EQ(cached, full) << s;
    EXPECT_NE(cached.find("=== sample 2 ===\nmany ranks and"), std::string::npos) << cached;
  }
}

}  // namespace
