// The process launcher behind `atoll launch` (torchrun's role): starts this node's ranks with
// torchrun's environment, hosts the rendezvous store on node 0, prefixes every output line with
// its rank, and tears the job down when any rank fails.
#pragma once
#include <string>
#include <vector>

namespace atl::comm {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string rdzv_host = "127.0.0.1";  // node 0's address, reachable from every node
  int rdzv_port = 0;  // the store's port; 0: a free one (single node only). MASTER_PORT = rdzv_port + 1
  double timeout_s = 0;  // > 0: exported as ATOLL_COMM_TIMEOUT, every rank's collective timeout
  double connect_timeout_s = 0;  // > 0: exported as ATOLL_CONNECT_TIMEOUT (start-up connections)
  double grace_s = 5;    // after a failure, how long the other ranks get to exit by themselves
  std::vector<std::string> cmd;
  // Fault tolerance (`atoll launch --ft`, issue 14): a rank that fails is started again, with
  // restart_args appended (e.g. --resume), up to max_restarts times in all, instead of tearing the
  // job down; the other ranks go on (they are quorum replicas, resilience/quorum.h).
  int max_restarts = 0;
  std::vector<std::string> restart_args;
  // DeadPool's hot spares (`atoll launch --ft --spares K`): K more processes of cmd with spare_args
  // appended (--fault.spare=true), RANK=0 and ATOLL_SPARE_ID=<world size + i>, that wait in the
  // lighthouse's pool; a rank that fails while a spare is left is not started again (a spare takes
  // its slot, resilience/deadpool.h) and the job goes on.
  int spares = 0;
  std::vector<std::string> spare_args;
  // Whole-job restarts (`atoll launch --max-restarts N` without --ft; torchrun's policy): when a
  // rank fails the others are torn down and the whole group is started again, up to max_restarts
  // times, with restart_cmd (empty: cmd itself; for `atoll train`, cmd with --resume, so that the
  // run goes on from its last committed checkpoint). Every rank gets TORCHELASTIC_RESTART_COUNT
  // (0 on the first start) and TORCHELASTIC_MAX_RESTARTS. Across nodes every node's launcher
  // restarts its ranks together with the others' (they agree through node 0's control store).
  bool restart_group = false;
  std::vector<std::string> restart_cmd;
  // `atoll launch --outlive N` (issue 15, Belayer's shadow rank): up to N ranks may fail without
  // the job being torn down or the rank restarted; the others go on (an RL job whose shadow rank
  // takes over a dead rollout rank, rl/shadow_rank.cpp). The job's status is that of the others.
  int outlive = 0;
  // `atoll launch --watch` (issue 14): a watcher process started beside the ranks (`atoll watch`);
  // when it exits with status 3 (it named a hang) the job is torn down at once.
  std::vector<std::string> watch_cmd;
};

// Runs the job to completion (with restart_group, through up to max_restarts restarts); returns 0
// when every rank of the last start exited 0, otherwise 1 after printing which rank failed and how.
int launch(const LaunchOptions& opt);

}  // namespace atl::comm
