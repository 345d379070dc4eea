// Child processes for the multi-process resilience tests: start, signal, reap, with bounded waits.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace atl::resilience::test {

// Starts argv with extra environment entries, stdout and stderr to `log`, in its own process group.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log);
// Exit status (128 + signal for a signalled child); -1 after timeout_s (then the child is killed).
int wait_for(pid_t pid, double timeout_s);
std::string read_file(const std::string& path);
std::string self_exe();
// Milliseconds since the epoch, comparable across processes of one host.
int64_t wall_ms();

}  // namespace atl::resilience::test
