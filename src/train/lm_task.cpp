// Language-model pretraining ([train] task = "lm", the default): batches of token ids from the
// prepared shards, next-token cross-entropy, validation loss, and text sampled from the model when
// it generates (nn::TokenGenerator).
#include <filesystem>
#include <map>

#include "core/log.h"
#include "data/corpus.h"
#include "data/data_loader.h"
#include "data/tokenizer.h"
#include "resilience/invariant_gate.h"
#include "train/task.h"
#include "train/trainer.h"

namespace atl {
namespace fs = std::filesystem;

namespace {

class LanguageModelTask final : public Task {
 public:
  LanguageModelTask(const TrainOptions& o, int64_t epochs) : o_(o), epochs_(epochs) {}
  std::string name() const override { return "lm"; }

  void setup(nn::Model& model, const TaskEnv& env) override {
    env_ = env;
    tok_ = load_tokenizer(o_.tokenizer);
    if (!fs::exists(fs::path(o_.data_dir) / "meta.json") && o_.auto_prepare) {
      if (env.leads()) {
        log::info("preparing the default corpus (Debian fortunes) into {} ...", o_.data_dir);
        prepare_default_corpus(o_.data_dir, o_.tokenizer);
      }
      if (env.comm) env.comm->barrier();  // the others wait for rank 0's data
    }
    check_prepared_tokenizer(o_.data_dir, o_.tokenizer);  // ids of another tokenizer mean nothing
    int64_t vocab = token_model(model).vocab_size();
    ATOLL_CHECK(vocab >= tok_->vocab_size(), "model.vocab_size {} is smaller than the tokenizer's {}", vocab,
                tok_->vocab_size());
    int64_t block = token_model(model).max_sequence_length();
    ATOLL_CHECK(block == 0 || o_.seq_len <= block, "train.seq_len {} exceeds model.block_size {}", o_.seq_len, block);
    train_ = std::make_unique<DataLoader>(o_.data_dir, "train", int(o_.batch_size), int(o_.seq_len), env.rank,
                                          env.world, uint64_t(o_.seed));
    // Evaluation is split like training: each rank scores its share of the validation rows.
    val_ = std::make_unique<DataLoader>(o_.data_dir, "val", int(o_.batch_size), int(o_.seq_len), env.rank, env.world,
                                        uint64_t(o_.seed));
    // Both splits before step 1: a bad id in the validation shards would otherwise surface only at
    // the first evaluation, after training time is spent.
    train_->validate_vocab(int32_t(vocab));
    val_->validate_vocab(int32_t(vocab));
    if (epochs_ > 0) train_->set_uneven(true);  // finite data runs out unevenly; the trainer joins
    batch_.input = Tensor::empty({o_.batch_size, o_.seq_len}, DType::i32);
    batch_.target = Tensor::empty({o_.batch_size, o_.seq_len}, DType::i32);
  }

  const Batch& next_batch() override {
    train_->next_batch(batch_.input.i32(), batch_.target.i32());
    return batch_;
  }

  double evaluate(const nn::Model& model) override {
    NoGradGuard ng;
    val_->reset();
    Batch b{Tensor::empty({o_.batch_size, o_.seq_len}, DType::i32), Tensor::empty({o_.batch_size, o_.seq_len}, DType::i32)};
    double total = 0;
    for (int64_t i = 0; i < o_.eval_steps; ++i) {
      val_->next_batch(b.input.i32(), b.target.i32());
      total += loss(model, b).item();
    }
    return total / double(o_.eval_steps);
  }

  std::string sample(const nn::Model& model, Rng& rng) override {
    auto* gen = dynamic_cast<const nn::TokenGenerator*>(&model);
    if (!gen) return "";
    std::vector<int32_t> prompt = o_.sample_prompt.empty() ? std::vector<int32_t>{tok_->eot()} : tok_->encode(o_.sample_prompt);
    auto seq = gen->generate(prompt, o_.sample_tokens, o_.sample_temperature, o_.sample_top_k, rng);
    std::vector<int32_t> out(seq.begin() + int64_t(prompt.size()), seq.end());
    for (auto& t : out)
      if (t == tok_->eot()) t = int32_t('\n');
    return (o_.sample_prompt.empty() ? "" : o_.sample_prompt) + tok_->decode(out);
  }

  int64_t tokens_per_batch() const override { return o_.batch_size * o_.seq_len; }
  int64_t sequence_length() const override { return o_.seq_len; }

  nlohmann::json data_state() const override { return train_->state().to_json(); }
  int64_t batches_left() const override {
    return epochs_ > 0 ? int64_t(train_->batches_left(uint64_t(epochs_))) : -1;
  }

  void set_data_state(const nlohmann::json& j, const TaskEnv& env) override {
    // Saved by rank 0 of a job of any size: rank r of W goes on after the rows the whole job
    // consumed (exact when W divides them).
    DataLoaderState ds = DataLoaderState::from_json(j);
    ds.position = ds.position * uint64_t(ds.world_size) / uint64_t(env.world);
    ds.rank = env.rank;
    ds.world_size = env.world;
    train_->set_state(ds);
  }

  bool can_replay() const override { return epochs_ == 0; }
  void start_replay(const nlohmann::json& state, int share, int world) override {
    DataLoaderState ds = DataLoaderState::from_json(state);
    ATOLL_CHECK(ds.world_size == world, "replay: the data position is of a job of {} ranks, not {}", ds.world_size, world);
    ds.rank = share;  // ranks of one job move in lockstep: the same epoch and position
    auto& l = replay_[share];
    if (!l)  // one loader per replayed share, kept: a witness replays the same shares every time
      l = std::make_unique<DataLoader>(o_.data_dir, "train", int(o_.batch_size), int(o_.seq_len), share, world,
                                       uint64_t(o_.seed));
    l->set_state(ds);
    replaying_ = l.get();
  }
  const Batch& next_replay_batch() override {
    ATOLL_CHECK(replaying_, "replay: next_replay_batch before start_replay");
    if (!replay_batch_.input.defined()) {
      replay_batch_.input = Tensor::empty({o_.batch_size, o_.seq_len}, DType::i32);
      replay_batch_.target = Tensor::empty({o_.batch_size, o_.seq_len}, DType::i32);
    }
    replaying_->next_batch(replay_batch_.input.i32(), replay_batch_.target.i32());
    return replay_batch_;
  }

 private:
  static const nn::TokenModel& token_model(const nn::Model& model) {
    auto* t = dynamic_cast<const nn::TokenModel*>(&model);
    ATOLL_CHECK(t, "[train] task = 'lm' needs a model over token ids (nn::TokenModel); model family '{}' is not one",
                model.family());
    return *t;
  }

  // The loader gives rank r of W the window slots r, r + W, r + 2W... of each epoch's order: a
  // residue class, written as the range [r, r + 1) of "slot mod W" over these files.
  nlohmann::json data_facts() const override {
    std::string files;
    for (auto& f : train_->files()) files += fs::path(f).filename().string() + ";";
    return {{"space", fmt::format("train window slots mod {} ({} windows of {} tokens in {} files, seed {})", env_.world,
                                  train_->num_windows(), o_.seq_len, train_->files().size(), o_.seed) +
                          " files " + resilience::hash_hex(files)},
            {"shards", {{env_.rank, env_.rank + 1}}},
            // Finite data: unequal counts are what Join is for, so the gate does not compare them.
            {"batches_per_epoch", epochs_ > 0 ? uint64_t(0) : train_->batches_per_epoch()}};
  }

  const TrainOptions& o_;
  int64_t epochs_ = 0;  // [data] epochs: 0 = endless
  TaskEnv env_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<DataLoader> train_, val_;
  Batch batch_;
  std::map<int, std::unique_ptr<DataLoader>> replay_;  // by share
  DataLoader* replaying_ = nullptr;
  Batch replay_batch_;
};

TaskRegistrar lm("lm", [](Config& cfg, const TrainOptions& o) -> std::unique_ptr<Task> {
  return std::make_unique<LanguageModelTask>(o, cfg.get_int("data.epochs", 0, 0, 1 << 20));
});

}  // namespace
}  // namespace atl
