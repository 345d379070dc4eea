// AdamW with its moments in a memory-mapped file (optim/state_file.h): the streamed step gives
// bit-identical parameters and state to resident AdamW (the update is elementwise and the chunks
// keep the kernel's vector blocks where they were), and hands the pages back to the file, so
// the mapping holds nothing resident between steps.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "optim/adamw.h"
#include "tensor/rng.h"

using namespace atl;

namespace {
struct Params {
  std::vector<Tensor> v, g;
  std::vector<ParamRef> refs;
  explicit Params(const std::vector<Shape>& shapes) {
    Rng r(3, 0);
    for (size_t i = 0; i < shapes.size(); ++i) {
      v.push_back(Tensor::empty(shapes[i]));
      g.push_back(Tensor::zeros(shapes[i]));
      r.fill_normal(v.back(), 0.f, 1.f);
      refs.push_back({"p" + std::to_string(i), v.back(), g.back(), ParamRole::automatic});
    }
  }
};
}  // namespace

TEST(AdamWOffload, StreamedStepIsBitIdenticalAndGivesItsPagesBack) {
  // A matrix over many chunks with a ragged tail, a vector smaller than one chunk.
  const std::vector<Shape> shapes = {{300, 1001}, {7}};
  Params a(shapes), b(shapes);
  AdamWConfig ca{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  AdamWConfig cb = ca;
  cb.offload_dir = std::filesystem::temp_directory_path().string();
  cb.stream_chunk = 4096;
  AdamW ra(a.refs, ca), ob(b.refs, cb);
  std::vector<std::pair<std::string, Tensor>> st;
  ob.save_state(st, "");
  const float* base = st[1].second.f32();  // p0.exp_avg: the mapping's first page
  ASSERT_GT(mapping_resident_bytes(base), -1) << "no mapping starts at the offloaded state";
  for (int s = 0; s < 3; ++s) {
    Rng r(100 + uint64_t(s), 0);
    for (size_t i = 0; i < shapes.size(); ++i) {
      r.fill_normal(a.g[i], 0.f, 1.f);
      b.g[i].copy_from(a.g[i]);
    }
    ra.step({1.f, 0.7f});
    ob.step({1.f, 0.7f});
    EXPECT_EQ(mapping_resident_bytes(base), 0) << "step " << s + 1 << " left moments resident";
  }
  for (size_t i = 0; i < shapes.size(); ++i)
    EXPECT_EQ(std::memcmp(a.v[i].f32(), b.v[i].f32(), size_t(a.v[i].numel()) * 4), 0) << "parameter " << i;
  std::vector<std::pair<std::string, Tensor>> sa, sb;
  ra.save_state(sa, "");
  ob.save_state(sb, "");  // reading the state pages it back in
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t k = 1; k < sa.size(); ++k)
    EXPECT_EQ(std::memcmp(sa[k].second.f32(), sb[k].second.f32(), size_t(sa[k].second.numel()) * 4), 0) << sa[k].first;
  EXPECT_GT(mapping_resident_bytes(base), 0) << "reading the moments did not page them in (the check above is void)";
}
