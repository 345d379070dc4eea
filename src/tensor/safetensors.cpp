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
  nlohmann::ordered_json h = nlohmann::ordered_json::object();  // "{}", not "null", when empty
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

// Every field of the header is checked for its JSON type and range before use: the header is
// outside input (a Hugging Face download, a damaged checkpoint), and a wrong type must give an
// error naming the tensor, never a JSON library exception; a shape's element count is bounded by
// the bytes the file holds before anything is allocated.
TensorFile safetensors_decode(const std::string& bytes, const std::string& what) {
  ATOLL_CHECK(bytes.size() >= 8, "{}: not a safetensors file (only {} bytes)", what, bytes.size());
  uint64_t hl;
  std::memcpy(&hl, bytes.data(), 8);
  ATOLL_CHECK(hl <= bytes.size() - 8, "{}: truncated safetensors header (claims {} bytes)", what, hl);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + std::ptrdiff_t(hl));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed safetensors header: {}", what, e.what());
  }
  // atoll wrote "null" for a file of no tensors before (an optimizer without state): still read.
  if (h.is_null()) h = nlohmann::json::object();
  ATOLL_CHECK(h.is_object(), "{}: malformed safetensors header: not a JSON object", what);
  const size_t base = 8 + hl, avail = bytes.size() - base;
  TensorFile tf;
  std::vector<std::tuple<size_t, std::string, Tensor>> ordered;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      ATOLL_CHECK(v.is_object(), "{}: safetensors __metadata__ is not an object", what);
      for (auto& [k, mv] : v.items()) {
        ATOLL_CHECK(mv.is_string(), "{}: safetensors metadata '{}' is not a string", what, k);
        tf.metadata[k] = mv.get<std::string>();
      }
      continue;
    }
    const std::string& tensor = name;  // (a structured binding cannot be captured before C++20's fix)
    auto bad = [&](const char* why) { fail("{}: tensor '{}': {}", what, tensor, why); };
    if (!v.is_object()) bad("its header entry is not an object");
    auto dtype = v.find("dtype"), shape_it = v.find("shape"), offs = v.find("data_offsets");
    if (dtype == v.end() || !dtype->is_string()) bad("\"dtype\" is missing or not a string");
    if (shape_it == v.end() || !shape_it->is_array()) bad("\"shape\" is missing or not an array");
    if (offs == v.end() || !offs->is_array() || offs->size() != 2 || !(*offs)[0].is_number_unsigned() ||
        !(*offs)[1].is_number_unsigned())
      bad("\"data_offsets\" is not a pair of integers >= 0");
    DType dt = dtype_from_name(dtype->get<std::string>());
    Shape shape;
    for (const auto& d : *shape_it) {
      if (!d.is_number_unsigned()) bad("\"shape\" holds something other than integers >= 0");
      if (d.get<uint64_t>() > uint64_t(INT64_MAX)) bad("a dimension is too large");
      shape.push_back(d.get<int64_t>());
    }
    const size_t b = (*offs)[0].get<size_t>(), e = (*offs)[1].get<size_t>();
    ATOLL_CHECK(b <= e && e <= avail, "{}: tensor '{}' lies outside the file (truncated?)", what, name);
    // The element count times the element size must equal e - b <= avail: checked by division,
    // dimension by dimension, so that no product can overflow. The non-zero dimensions of an
    // empty tensor are bounded too: strides and partial products of the shape are formed from them.
    const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
    const uint64_t cap = empty ? uint64_t(INT64_MAX) / 8 : (e - b) / dtype_size(dt);
    uint64_t numel = 1;
    for (int64_t d : shape) {
      if (d == 0) continue;
      if (uint64_t(d) > cap / numel)
        fail("{}: tensor '{}' has {} bytes, too few for shape {}", what, name, e - b, shape_str(shape));
      numel *= uint64_t(d);
    }
    if (empty) numel = 0;
    ATOLL_CHECK(e - b == numel * dtype_size(dt), "{}: tensor '{}' has {} bytes for shape {}", what, name, e - b,
                shape_str(shape));
    Tensor t = Tensor::empty(shape, dt);
    if (e > b) std::memcpy(t.raw(), bytes.data() + base + b, e - b);
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
