// A second model family, registered from here and known to no file under src/: a token MLP
// (embedding, residual RMSNorm-GELU MLP blocks, an untied output head), trained through the same
// trainer, data-parallel strategies and optimizers as GPT. It proves the contract (nn/model.h):
// roles route the optimizers, blocks are ZeRO-3's units, and a 2-rank DDP or ZeRO-3 job follows
// one rank at the doubled batch.
//
// Ranks are this binary started again under --gtest_filter=ModelFamily.RankProgram with the
// config in ATOLL_MODEL_FAMILY_CFG.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/ops.h"
#include "core/config.h"
#include "harness.h"
#include "nn/layers.h"
#include "nn/model.h"
#include "optim/param_groups.h"
#include "parallel/data_parallel.h"
#include "tensor/rng.h"
#include "train/trainer.h"

using namespace atl;
using namespace atl::parallel::test;
namespace fs = std::filesystem;

namespace {

class MlpBlock : public nn::Module {
 public:
  MlpBlock(std::string prefix, int64_t C, int64_t H) : Module(std::move(prefix)) {
    norm = child<nn::Norm>("norm", C, /*rms=*/true, /*bias=*/false, 1e-5f);
    up = child<nn::Linear>("up", C, H, true);
    down = child<nn::Linear>("down", H, C, true);
  }
  Tensor operator()(const Tensor& x) const { return ops::add(x, (*down)(ops::gelu((*up)((*norm)(x))))); }
  nn::Norm* norm;
  nn::Linear *up, *down;
};

// Next-token prediction from the current token alone (a bigram model with depth).
class TokenMlp final : public nn::Model, public nn::TokenModel {
 public:
  TokenMlp(int64_t V, int64_t C, int64_t H, int64_t L) : Model(""), V_(V), C_(C), H_(H) {
    embed = child<nn::Embedding>("embed", V, C);
    for (int64_t l = 0; l < L; ++l) blocks_.push_back(child<MlpBlock>("blocks." + std::to_string(l), C, H));
    out = child<nn::Linear>("out", C, V, /*bias=*/false, ParamRole::head);
    materialize();
  }
  std::string family() const override { return "test_mlp"; }
  std::string describe() const override {
    return "token MLP L=" + std::to_string(blocks_.size()) + " d=" + std::to_string(C_) + " V=" + std::to_string(V_);
  }
  int64_t vocab_size() const override { return V_; }
  void init_weights(uint64_t seed) override {
    Rng rng(seed, 0);
    for (nn::Parameter* p : parameters()) {
      if (p->shape.size() >= 2) rng.fill_normal(p->value, 0.f, 0.05f);
      else p->value.fill(p->name.size() > 5 && p->name.substr(p->name.size() - 5) == ".bias" ? 0.f : 1.f);
    }
  }
  Tensor forward(const Tensor& tokens) const override {
    begin_forward();
    Tensor x = ops::embedding(tokens, embed->weight->value, Tensor());
    x = run_blocks(x, blocks_.size(), [this](size_t i, const Tensor& in) { return (*blocks_[i])(in); });
    return (*out)(x);
  }
  Tensor loss(const Tensor& tokens, const Tensor& targets) const override {
    return ops::cross_entropy(forward(tokens), targets, /*reuse_logits=*/true);
  }
  std::vector<Module*> blocks() override { return {blocks_.begin(), blocks_.end()}; }
  std::map<std::string, std::string> config_metadata() const override {
    auto md = Model::config_metadata();
    md["atoll_model"] = nlohmann::json{{"vocab_size", V_}, {"n_embd", C_}, {"hidden", H_},
                                       {"n_layer", int64_t(blocks_.size())}}.dump();
    return md;
  }

  nn::Embedding* embed;
  nn::Linear* out;

 private:
  int64_t V_, C_, H_;
  std::vector<MlpBlock*> blocks_;
};

nn::ModelRegistrar test_mlp("test_mlp", nn::ModelFamily{
    [](Config& cfg, const std::string& s) -> std::unique_ptr<nn::Model> {
      return std::make_unique<TokenMlp>(cfg.get_int(s + ".vocab_size", 257, 2), cfg.get_int(s + ".n_embd", 32, 1),
                                        cfg.get_int(s + ".hidden", 64, 1), cfg.get_int(s + ".n_layer", 3, 1));
    },
    [](const std::map<std::string, std::string>& md) -> std::unique_ptr<nn::Model> {
      auto j = nlohmann::json::parse(md.at("atoll_model"));
      return std::make_unique<TokenMlp>(j["vocab_size"], j["n_embd"], j["hidden"], j["n_layer"]);
    }});

std::vector<double> losses(const fs::path& run) {
  std::ifstream f(run / "metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());  // segment lines carry none
  }
  return out;
}

// A prepared corpus (byte tokens) and a config training the test family on it.
struct Fixture {
  fs::path root;
  Fixture() {
    root = fs::temp_directory_path() / ("atoll_model_family_" + std::to_string(getpid()));
    fs::remove_all(root);
    fs::create_directories(root);
    std::ofstream txt(root / "corpus.txt");
    const char* words[] = {"a", "second", "model", "family", "trains", "on", "the", "same", "engine", "too"};
    uint32_t s = 4242;
    for (int doc = 0; doc < 200; ++doc) {
      for (int w = 0; w < 40; ++w) {
        s = s * 1664525u + 1013904223u;
        txt << words[(s >> 16) % 10] << (w % 9 == 8 ? ".\n" : " ");
      }
      txt << "\n%\n";
    }
    txt.close();
    int rc = run_command({std::string(ATOLL_BINARY_DIR) + "/atoll", "data", "prepare", "--input",
                          (root / "corpus.txt").string(), "--out", (root / "data").string(), "--val-fraction", "0.1"},
                         {}, (root / "prepare.log").string(), 60);
    EXPECT_EQ(rc, 0) << read_file((root / "prepare.log").string());
  }
  ~Fixture() { fs::remove_all(root); }
  // The config of run `run` with per-rank batch `batch` and extra [parallel] lines.
  std::string config(const std::string& run, int batch, const std::string& parallel = "") const {
    std::ostringstream c;
    c << "[run]\ndir = \"" << (root / run).string() << "\"\n"
      << "[data]\ndir = \"" << (root / "data").string() << "\"\nauto_prepare = false\n"
      << "[model]\nfamily = \"test_mlp\"\nn_layer = 3\nn_embd = 32\nhidden = 64\n"
      << "[train]\nsteps = 5\nbatch_size = " << batch << "\nseq_len = 32\nwarmup_steps = 1\nthreads = 1\n"
      << "[optim.adamw]\nlr = 1e-2\n[eval]\nevery = 0\n[sample]\nevery = 0\n[checkpoint]\nevery = 0\n"
      << "[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n"
      << (parallel.empty() ? "" : "[parallel]\n" + parallel);
    return c.str();
  }
  fs::path write(const std::string& name, const std::string& text) const {
    fs::path p = root / name;
    std::ofstream(p) << text;
    return p;
  }
};

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tol) << what << " at step " << i + 1;
}

}  // namespace

TEST(ModelFamily, RegisteredFromTestsWithRolesAndBlocks) {
  Config cfg = Config::parse("[model]\nfamily = \"test_mlp\"\nn_layer = 2\n", "family.toml");
  auto m = nn::make_model(cfg, "model");
  ASSERT_EQ(m->family(), "test_mlp");
  EXPECT_EQ(m->blocks().size(), 2u);
  auto refs = m->param_refs();
  ASSERT_EQ(refs.front().name, "embed.weight");
  EXPECT_EQ(classify_param(refs.front()), ParamClass::embedding);
  EXPECT_EQ(classify_param(refs.back()), ParamClass::head) << refs.back().name;
  EXPECT_EQ(classify_param(*std::find_if(refs.begin(), refs.end(), [](auto& r) { return r.name == "blocks.0.up.weight"; })),
            ParamClass::hidden);
  EXPECT_EQ(classify_param(*std::find_if(refs.begin(), refs.end(), [](auto& r) { return r.name == "blocks.0.up.bias"; })),
            ParamClass::vector);
  // The default plan: the blocks are the sharding units, nothing for tensor parallelism, so a
  // mesh with tp = 2 is refused naming the family.
  nn::ParallelPlan plan = m->parallelize();
  EXPECT_TRUE(plan.covers(nn::ParallelStyle::shard_unit));
  EXPECT_FALSE(plan.covers(nn::ParallelStyle::colwise));
  parallel::MeshShape mesh;
  mesh.tp = 2;
  try {
    parallel::check_mesh_supported(mesh, *m);
    ADD_FAILURE() << "tp = 2 accepted for a model without a tensor-parallel plan";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model family 'test_mlp' plans no tensor parallelism"), std::string::npos)
        << e.what();
  }
  // Weights round-trip through the state dict and the registry's metadata.
  m->init_weights(3);
  auto copy = nn::model_from_metadata(m->config_metadata());
  copy->load_state_dict(m->state_dict(), "test");
  EXPECT_EQ(copy->flat_values().to_vector(), m->flat_values().to_vector());
}

// A rank of the multi-process test when ATOLL_MODEL_FAMILY_CFG is set; otherwise one rank through
// the trainer, whose loss must fall.
TEST(ModelFamily, RankProgram) {
  if (const char* p = std::getenv("ATOLL_MODEL_FAMILY_CFG")) {
    Config cfg = Config::load(p);
    Trainer t(cfg);
    t.run(false);
    return;
  }
  Fixture f;
  Config cfg = Config::parse(f.config("one", 8), "one.toml");
  Trainer t(cfg);
  TrainResult r = t.run(false);
  auto l = losses(f.root / "one");
  ASSERT_EQ(l.size(), 5u);
  EXPECT_LT(l.back(), l.front() - 0.1) << "the test family's loss must fall";
  EXPECT_EQ(r.final_step, 5);
}

TEST(ModelFamily, DdpAndZero3FollowOneRank) {
  Fixture f;
  {
    Config cfg = Config::parse(f.config("one", 8), "one.toml");
    Trainer t(cfg);
    t.run(false);
  }
  auto one = losses(f.root / "one");
  ASSERT_EQ(one.size(), 5u);
  // DDP by the old key; ZeRO-3 by the mesh's: dp_shard = 2 on 2 ranks.
  for (auto [run, parallel] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "strategy = \"ddp\"\n"}, {"zero3", "dp_shard = 2\n"}}) {
    fs::path cfg = f.write(run + ".toml", f.config(run, 4, parallel));
    std::string tag = (f.root / run).string();
    auto codes = run_rank_programs(2, "ModelFamily.RankProgram", {"ATOLL_MODEL_FAMILY_CFG=" + cfg.string()}, tag, 120);
    for (size_t r = 0; r < codes.size(); ++r)
      ASSERT_EQ(codes[r], 0) << run << " rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
    std::string log = read_file(tag + ".log0");
    EXPECT_NE(log.find("data parallel: " + run + " over 2 ranks"), std::string::npos) << log;
    // Averaged gradients equal one rank's at the doubled batch up to float summation order.
    expect_close(losses(f.root / run), one, 1e-4, run + " loss");
  }
}
