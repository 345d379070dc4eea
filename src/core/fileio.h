// Whole-file reads and crash-safe writes (temporary file, fsync, rename).
#pragma once
#include <string>

namespace atl {

std::string read_file(const std::string& path);
// Writes to path + ".tmp", flushes it to disk, then renames over path: a reader sees the old file
// or the new one, never a torn one.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace atl
