// The byte tokenizer and the factory that turns a tokenizer spec into a Tokenizer.
#include "data/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "data/tokenizer_gpt2.h"

namespace atl {

namespace fs = std::filesystem;

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = uint8_t(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (int32_t id : ids) {
    ATOLL_CHECK(id >= 0 && id <= 256, "byte tokenizer: id {} is outside its vocabulary of 257", id);
    if (id == 256)
      s += "<|endoftext|>";
    else
      s += char(uint8_t(id));
  }
  return s;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  ATOLL_CHECK(!spec.empty(),
              "empty tokenizer spec: use \"byte\" or the directory of a GPT-2 BPE "
              "tokenizer (encoder.json + vocab.bpe)");
  return Gpt2BpeTokenizer::load(spec);
}

std::string canonical_tokenizer_spec(const std::string& spec) {
  if (spec == "byte") return spec;
  fs::path p(spec);
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) p = p.parent_path();
  if (p.empty()) p = ".";
  fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal().string() : c.string();
}

}  // namespace atl
