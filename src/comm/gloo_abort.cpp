// Failing a Gloo TCP pair from outside its event loop, for Communicator::abort(): Gloo's own
// Pair::signalExceptionExternal (what its buffers call on a timeout) fails the pair and wakes every
// operation waiting on it. Debian's libgloo-dev does not ship the headers that declare it
// (gloo/transport/tcp/pair.h includes the missing gloo/common/memory.h), so this file declares just
// that non-virtual member, which libgloo exports; no other file of atoll sees this declaration.
#ifdef ATOLL_HAVE_GLOO
#include <exception>
#include <string>
#include <typeinfo>

#include <gloo/transport/pair.h>

namespace gloo::transport::tcp {
class Pair {
 public:
  std::exception_ptr signalExceptionExternal(const std::string& msg);
};
}  // namespace gloo::transport::tcp

namespace atl::comm {

bool gloo_fail_pair(gloo::transport::Pair* p, const std::string& msg) {
  // Only Gloo's TCP pair: its transport::Pair base comes first, so both share one address.
  if (!p || std::string(typeid(*p).name()) != "N4gloo9transport3tcp4PairE") return false;
  reinterpret_cast<gloo::transport::tcp::Pair*>(p)->signalExceptionExternal(msg);
  return true;
}

}  // namespace atl::comm
#endif
