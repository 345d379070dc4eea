// Gradient coding in a data-parallel loop (issue 14 item 5; Tandon et al., ICML 2017, for the
// codes; seed "Pipelined Gradient Coding" for spreading a worker's partitions over steps). The
// data is cut into n partitions, one code (gradient_coding.h) says which s + 1 each worker holds,
// and each step a rank decodes the full gradient sum_j g_j from the first n - s coded messages in
// (coded_exchange.h): s stragglers, or stopped ranks, cost the others nothing.
//
// Schemes (CodingScheme):
//  - pipelined: each worker computes ONE partition per step — at step t, partition j is computed
//    (by every worker holding it) when j = t (mod s + 1) — and keeps the latest gradient of each
//    of its s + 1 partitions; its message combines them. Because a partition is computed at the
//    same step by all its holders, any n - s messages decode to the same sum
//    sum_j g_j(theta_{tau_j(t)}), tau_j(t) = the last step <= t with tau = j (mod s + 1): the full
//    gradient with partition j at most s steps stale. Same compute per step as uncoded data
//    parallelism, (s + 1)-fold less than plain gradient coding. Needs (s + 1) | n (so that every
//    worker's s + 1 partitions have distinct residues; a cyclic window of s + 1 on n points can be
//    coloured so only then).
//  - plain: every worker computes all s + 1 of its partitions each step (fresh full gradient,
//    (s + 1)x the compute).
//  - ignore (baseline): worker w computes partition w; the first n - s messages are summed and
//    scaled by n / (n - s) — the stragglers' data is simply lost.
//  - uncoded (baseline): worker w computes partition w and waits for all n.
//
// A rank that finds the n - s messages of a step and of the next already in when it gets there (it
// is the straggler: the others went on) skips its own computation and only decodes and applies (catching up); in the
// pipelined scheme it then holds stale partitions and sends nothing until all s + 1 were refreshed.
// With the fractional code the messages of one group are bitwise equal, so every rank decodes the
// same bits whichever n - s came first (replicas stay bitwise equal); with the cyclic code the
// decoded sum depends on the subset to rounding (about amplification() x 6e-8 of its scale).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "resilience/coded_exchange.h"
#include "resilience/gradient_coding.h"

namespace atl::resilience {

enum class CodingScheme { pipelined, plain, ignore, uncoded };
CodingScheme parse_coding_scheme(const std::string& s);  // "pipelined", "plain", "ignore", "uncoded"
const char* coding_scheme_name(CodingScheme s);

// The straggler injector: `rank` sleeps delay_ms in each step it computes; from step stop_at
// (> 0) it stops itself (SIGSTOP), as a hung host would, until continued; `withhold(step)`: this rank computes
// but sends nothing at that step (a dropped message; tests use it to miss any s ranks).
struct StragglerInjector {
  int rank = -1;
  double delay_ms = 0;
  int64_t stop_at = 0;
  std::function<bool(int rank, int64_t step)> withhold;
  bool catch_up = true;  // a rank the others left more than a step behind decodes without computing
};

struct CodedStepInfo {
  bool computed = false;     // false: caught up (the step's messages were in before this rank got there)
  bool sent = false;
  std::vector<int> decoded;  // the ranks whose messages were used
  double wait_ms = 0;        // waiting for messages
};

class CodedDataParallel {
 public:
  // grad(j, out): partition j's gradient (len floats, overwritten) at the current parameters.
  using PartitionGrad = std::function<void(int partition, float* out)>;
  CodedDataParallel(CodedExchange& ex, GradientCode code, CodingScheme scheme, int64_t len,
                    StragglerInjector straggler = {}, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Step t (0, 1, ...; every rank runs every step, in order): `full` receives sum_j g_j, decoded.
  CodedStepInfo step(int64_t t, const PartitionGrad& grad, float* full);
  // The partitions this rank computes at step t.
  std::vector<int> computes_at(int64_t t) const;
  // Pipelined: the step partition j's gradient in the decoded sum of step t comes from (-1: none yet).
  int64_t source_step(int partition, int64_t t) const;
  const GradientCode& code() const { return code_; }

 private:
  bool pipelined_valid(int64_t t) const;
  CodedExchange& ex_;
  GradientCode code_;
  CodingScheme scheme_;
  int64_t len_;
  StragglerInjector inj_;
  std::chrono::milliseconds timeout_;
  int n_, s_, w_;
  std::vector<int> mine_;                     // this worker's partitions
  std::vector<std::vector<float>> slot_;      // pipelined: latest gradient per partition of mine_
  std::vector<int64_t> stamp_;                // ... and the step it was computed at (-1: never)
};

}  // namespace atl::resilience
