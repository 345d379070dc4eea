#include "optim/state_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace atl {

StateFile::StateFile(const std::string& dir, int64_t floats) : floats_(floats) {
  static std::atomic<int> counter{0};
  const long page = sysconf(_SC_PAGESIZE);
  bytes_ = size_t((floats * int64_t(sizeof(float)) + page - 1) / page * page);
  if (bytes_ == 0) bytes_ = size_t(page);
  const std::string path = dir + "/atoll_optimizer_state." + std::to_string(getpid()) + "." +
                           std::to_string(counter++);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ATOLL_CHECK(fd >= 0, "optimizer state file {}: cannot create it ({}); set train.offload_dir to a writable "
              "directory", path, std::strerror(errno));
  ::unlink(path.c_str());  // gone with the mapping, whatever happens
  if (::ftruncate(fd, off_t(bytes_)) != 0) {
    int e = errno;
    ::close(fd);
    fail("optimizer state file {}: cannot size it to {} bytes ({})", path, bytes_, std::strerror(e));
  }
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);
  ATOLL_CHECK(p != MAP_FAILED, "optimizer state file {}: cannot map {} bytes ({})", path, bytes_, std::strerror(e));
  base_ = static_cast<float*>(p);
}

StateFile::~StateFile() {
  if (base_) ::munmap(base_, bytes_);
}

void StateFile::release(int64_t lo, int64_t hi) const {
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t b0 = (lo * int64_t(sizeof(float)) + page - 1) / page * page;
  const int64_t b1 = std::min<int64_t>(int64_t(bytes_), hi * int64_t(sizeof(float)) / page * page);
  if (b1 > b0) ::madvise(reinterpret_cast<char*>(base_) + b0, size_t(b1 - b0), MADV_DONTNEED);
}

Tensor StateFile::view(int64_t offset, const Shape& shape) const {
  ATOLL_CHECK(offset >= 0 && offset + shape_numel(shape) <= floats_, "optimizer state file: view out of range");
  return Tensor::wrap(base_ + offset, shape, DType::f32);
}

int64_t mapping_resident_bytes(const void* p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  const uintptr_t want = reinterpret_cast<uintptr_t>(p);
  while (std::getline(f, line)) {
    uintptr_t lo = 0;
    char dash = 0;
    std::istringstream s(line);
    if (line.find(':') == std::string::npos || line.find('-') < line.find(' ')) {
      if (s >> std::hex >> lo >> dash && dash == '-') {
        in = lo == want;
        continue;
      }
    }
    if (in && line.rfind("Rss:", 0) == 0) {
      std::istringstream r(line.substr(4));
      int64_t kb = 0;
      r >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmHWM:") {
      int64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
    std::getline(f, key);
  }
  return -1;
}

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}

}  // namespace atl
