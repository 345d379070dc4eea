// safetensors files (Hugging Face's format): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw bytes. atoll writes model weights
// with Hugging Face GPT-2 names in this format, so PyTorch and `transformers` read them directly.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace atl {

struct TensorFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  const Tensor* find(const std::string& name) const;
  const Tensor& get(const std::string& name) const;  // throws naming the file's tensors
};

// Serialises to bytes (so callers can checksum and write atomically).
std::string safetensors_encode(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});
TensorFile safetensors_decode(const std::string& bytes, const std::string& what);

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
TensorFile load_safetensors(const std::string& path);

}  // namespace atl
