// The data-parallel tests' harness: one training job of a tiny GPT on deterministic synthetic
// batches, run either in this process (one rank, the reference) or as N rank processes
// (`test_parallel --worker`) wired together through torchrun's environment variables.
//
// Row j of global micro-batch (step s, micro m) is the same tokens whatever the world size, and
// rank r of W with per-rank batch b takes rows [r*b, (r+1)*b); so W ranks at batch b see exactly
// the rows one rank sees at batch W*b, and their averaged gradients must agree.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/gpt/gpt.h"

namespace atl::parallel::test {

// The tiny GPT every data-parallel test trains (3 blocks, d=32, vocabulary 64).
nn::GPTConfig tiny_model();
// splitmix64: deterministic pseudo-random data and gradients from an index.
uint64_t mix(uint64_t x);

struct Job {
  std::string strategy = "ddp";
  int steps = 3;         // optimizer steps run by this job
  int start_step = 0;    // the step the job starts at (after loading a checkpoint)
  int batch = 2;         // rows per rank per micro-step
  int accum = 1;         // micro-steps per optimizer step
  double bucket_mb = 0.004;
  int hsdp_shard = 0;
  // Uneven inputs: data_steps[r] = steps rank r has data for (-1: all); must not increase with r.
  std::vector<int> data_steps;
  std::string load, save;  // full-state checkpoint files (safetensors), optional
  std::string out;         // where rank 0 writes the final full parameters (raw f32)
  std::string codec = "none";  // [parallel] codec (DDP)
  bool error_feedback = false;
  std::string optim = "adamw";  // or "adams" (the optimizer handed to the strategy)
  double scape_sparsity = 0.9;  // strategy "scape"

  std::vector<std::string> to_args() const;
  static Job from_args(int argc, char** argv);
};

// Runs the job as rank comm->rank() (comm null: one process). Returns the full final parameters.
std::vector<float> run_job(comm::Communicator* comm, const Job& job);
// Starts `world` worker processes of this binary for the job and waits for them (fails the test
// on a non-zero exit or a timeout, printing their output). Returns rank 0's parameters.
std::vector<float> run_ranks(int world, const Job& job, double timeout_s = 60);
double rel_diff(const std::vector<float>& a, const std::vector<float>& b);

int worker_main(int argc, char** argv);

// Runs argv with extra environment entries, output to `log`; returns the exit status (-1: timeout).
int run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                const std::string& log, double timeout_s);
std::string read_file(const std::string& path);
std::string self_exe();

// Float vectors through files (rank programs report their results so).
void write_floats(const std::string& path, const std::vector<float>& v);
std::vector<float> read_floats(const std::string& path);
// Largest elementwise relative difference (denominators floored at 1e-3).
double max_rel(const std::vector<float>& a, const std::vector<float>& b);

// Runs `world` copies of this binary filtered to one rank-program test, with torchrun's variables
// (a fresh port) plus `env`, output to tag.log<r>; returns each rank's exit status (-1: timeout).
std::vector<int> run_rank_programs(int world, const std::string& gtest_filter, const std::vector<std::string>& env,
                                   const std::string& tag, double timeout_s);
// Fails the test (with the rank's output) for every non-zero status; then reads each kind's
// tag.<kind>.<rank> float file, checks every rank equals rank 0 and returns rank 0's. Removes
// the files. Empty when a rank failed.
std::map<std::string, std::vector<float>> collect_kinds(const std::string& tag, const std::vector<int>& codes,
                                                        const std::vector<std::string>& kinds, const std::string& what);

}  // namespace atl::parallel::test
