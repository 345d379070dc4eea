#include "rl/multi_turn.h"

#include "core/error.h"

namespace atl::rl {

int64_t episode_positions(const VerifiableTask& task, int64_t max_new, int64_t turns) {
  return task.max_prompt_len() + turns * max_new + (turns - 1) * task.max_feedback_len();
}

std::vector<Episode> run_episodes(const nn::PolicyModel& policy, const VerifiableTask& task,
                                  const std::vector<const Problem*>& probs, const std::vector<std::vector<int32_t>>& rows,
                                  const nn::SamplingConfig& s, int64_t max_new, int64_t turns) {
  ATOLL_CHECK(probs.size() == rows.size() && turns >= 1, "rl: run_episodes needs one problem per row and a turn");
  std::vector<Episode> eps(rows.size());
  std::vector<size_t> going(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) going[i] = i;
  for (int64_t turn = 0; turn < turns && !going.empty(); ++turn) {
    std::vector<std::vector<int32_t>> ctx;
    for (size_t i : going) {
      ctx.push_back(rows[i]);
      ctx.back().insert(ctx.back().end(), eps[i].completion.begin(), eps[i].completion.end());
    }
    nn::SamplingConfig st = s;
    st.seed = s.seed ^ (uint64_t(turn) * 0x9E3779B97F4A7C15ull);
    const auto comps = policy.generate_batch(ctx, max_new, st);
    std::vector<size_t> next;
    for (size_t k = 0; k < going.size(); ++k) {
      Episode& e = eps[going[k]];
      const Problem& p = *probs[going[k]];
      e.completion.insert(e.completion.end(), comps[k].tokens.begin(), comps[k].tokens.end());
      e.env.insert(e.env.end(), comps[k].tokens.size(), 0);
      e.final_answer = decode(comps[k].tokens);
      e.stopped = comps[k].stopped;
      e.turns = turn + 1;
      const bool right = task.score(p, e.final_answer, e.stopped, 0.0).exact > 0;
      if (turn == 0) e.first_exact = right;
      if (right || !e.stopped || turn + 1 == turns) continue;
      // The turn's end marker (the model's token), then the environment's reply to it.
      e.completion.push_back(kEndMarker);
      e.env.push_back(0);
      const std::string reply = task.feedback(p, e.final_answer);
      ATOLL_CHECK(int64_t(reply.size()) <= task.max_feedback_len(), "rl: task {}'s reply '{}' exceeds its {} characters",
                  task.name(), reply, task.max_feedback_len());
      for (int32_t id : encode(reply)) {
        e.completion.push_back(id);
        e.env.push_back(1);
      }
      next.push_back(going[k]);
    }
    going = std::move(next);
  }
  return eps;
}

}  // namespace atl::rl
