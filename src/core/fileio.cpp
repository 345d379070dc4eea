#include "core/fileio.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace atl {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ATOLL_CHECK(in.good(), "cannot open '{}'", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ATOLL_CHECK(fd >= 0, "cannot create '{}': {}", tmp, std::strerror(errno));
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail("write to '{}' failed: {}", tmp, std::strerror(e));
    }
    off += size_t(w);
  }
  ::fsync(fd);
  ::close(fd);
  ATOLL_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '{}' to '{}': {}", tmp, path,
              std::strerror(errno));
}

}  // namespace atl
