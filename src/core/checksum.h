// CRC-32C (Castagnoli), used to detect corrupt or truncated checkpoint files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace atl {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t crc32c(const std::string& s) { return crc32c(s.data(), s.size()); }

}  // namespace atl
