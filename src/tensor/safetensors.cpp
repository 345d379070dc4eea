#include "tensor/safetensors.h"

#include <algorithm>
#include <cstring>
#include <cstdio>
#include "core/config.h"
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace atl {

const Tensor* TensorFile::find(const std::string& name) const {
  for (auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

const Tensor& TensorFile::get(const std::string& name) const {
  if (auto* t = find(name)) return *t;
  std::vector<std::string> names;
  for (auto& [n, t] : tensors) names.push_back(n);
  fail("tensor '{}' not found in file; nearest is '{}'", name, names.empty() ? "" : nearest(name, names));
}

std::string safetensors_encode(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h;
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  for (auto& [name, t] : tensors) {
    size_t nb = t.nbytes();
    h[name] = {{"dtype", dtype_safetensors_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  std::string out;
  out.resize(8 + header.size() + off);
  uint64_t hl = header.size();
  std::memcpy(out.data(), &hl, 8);  // x86 and arm64 are little-endian
  std::memcpy(out.data() + 8, header.data(), header.size());
  char* dst = out.data() + 8 + header.size();
  for (auto& [name, t] : tensors) {
    Tensor c = t.contiguous();
    std::memcpy(dst, c.raw(), c.nbytes());
    dst += c.nbytes();
  }
  return out;
}

TensorFile safetensors_decode(const std::string& bytes, const std::string& what) {
  ATOLL_CHECK(bytes.size() >= 8, "{}: not a safetensors file (only {} bytes)", what, bytes.size());
  uint64_t hl;
  std::memcpy(&hl, bytes.data(), 8);
  ATOLL_CHECK(hl <= bytes.size() - 8, "{}: truncated safetensors header (claims {} bytes)", what, hl);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(bytes.substr(8, hl));
  } catch (const std::exception& e) {
    fail("{}: malformed safetensors header: {}", what, e.what());
  }
  size_t base = 8 + hl, avail = bytes.size() - base;
  TensorFile tf;
  std::vector<std::tuple<size_t, std::string, Tensor>> ordered;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      for (auto& [k, mv] : v.items()) tf.metadata[k] = mv.get<std::string>();
      continue;
    }
    DType dt = dtype_from_name(v.at("dtype").get<std::string>());
    Shape shape = v.at("shape").get<Shape>();
    size_t b = v.at("data_offsets")[0].get<size_t>(), e = v.at("data_offsets")[1].get<size_t>();
    ATOLL_CHECK(b <= e && e <= avail, "{}: tensor '{}' lies outside the file (truncated?)", what, name);
    ATOLL_CHECK(e - b == size_t(shape_numel(shape)) * dtype_size(dt), "{}: tensor '{}' has {} bytes for shape {}",
                what, name, e - b, shape_str(shape));
    Tensor t = Tensor::empty(shape, dt);
    std::memcpy(t.raw(), bytes.data() + base + b, e - b);
    ordered.emplace_back(b, name, std::move(t));
  }
  std::sort(ordered.begin(), ordered.end(), [](auto& a, auto& b) { return std::get<0>(a) < std::get<0>(b); });
  for (auto& [b, n, t] : ordered) tf.tensors.emplace_back(n, std::move(t));
  return tf;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string bytes = safetensors_encode(tensors, metadata);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    ATOLL_CHECK(out.good(), "cannot write '{}'", tmp);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    ATOLL_CHECK(out.good(), "write to '{}' failed (disk full?)", tmp);
  }
  ATOLL_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '{}' to '{}'", tmp, path);
}

TensorFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ATOLL_CHECK(in.good(), "cannot open '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return safetensors_decode(ss.str(), path);
}

}  // namespace atl
