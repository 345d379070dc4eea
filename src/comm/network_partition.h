// A network partition of this process, simulated at the communicator for the fault campaign's
// network_partition (issue 14; train/fault_campaign_hook.h), where the test bed has no network
// namespace to take a link down in (tests/comm/test_netns.cpp does that for real). From the call
// on, nothing this process's communicators send leaves it and nothing reaches it: every collective
// and point-to-point operation waits out its deadline without a byte on the wire and fails as an
// unanswered one would, and the Gloo heartbeat and failure report stop reaching the rendezvous
// store (a partitioned node cannot reach node 0's store either). The connections stay open, as
// they do when a link goes down: the peers see silence, not a closed socket, and time out.
#pragma once

namespace atl::comm {

void partition_this_process();
bool this_process_partitioned();

}  // namespace atl::comm
