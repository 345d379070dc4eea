// The portable build (CMakeLists: generic code at x86-64-v3) must not leave instructions beyond
// AVX2 outside the kernels that are only called after run-time detection (isa.h): otherwise a
// binary built on the AMX Xeon dies with SIGILL on a CPU without AVX-512 or AMX. This test
// disassembles its own binary (which links the whole kernels layer) and lists every function
// that uses an AVX-512 or AMX register or instruction; each must be one of the dispatched kernels.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <string>

TEST(Portability, Avx512AndAmxOnlyInsideDispatchedKernels) {
#ifdef ATOLL_NATIVE_BUILD
  GTEST_SKIP() << "built with ATOLL_NATIVE=ON (-march=native): not portable, by request";
#endif
  if (std::system("command -v objdump > /dev/null 2>&1") != 0) GTEST_SKIP() << "objdump (binutils) not installed";
  // This binary's path (in the shell popen starts, /proc/self would be objdump itself).
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  FILE* p = popen(("objdump -d -C --no-show-raw-insn '" + self + "' 2>/dev/null").c_str(), "r");
  ASSERT_NE(p, nullptr);
  // zmm registers, the upper 16 xmm/ymm registers and opmask registers exist only with EVEX
  // (AVX-512) encodings; tile and bf16 dot-product mnemonics are AMX / AVX-512 BF16.
  const std::regex isa_ext(R"(%zmm|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|%k[0-7]\b|\btile|\btdp|\bvdpbf16|\bvcvtne2ps2bf16|\bldtilecfg)");
  const std::regex label(R"(^[0-9a-f]+ <(.*)>:$)");
  std::set<std::string> users;
  std::string fn, line;
  char buf[8192];
  size_t lines = 0;
  while (std::fgets(buf, sizeof buf, p)) {
    line = buf;
    if (!line.empty() && line.back() == '\n') line.pop_back();
    ++lines;
    std::smatch m;
    if (line.size() > 2 && line[0] != ' ' && std::regex_match(line, m, label)) fn = m[1];
    else if (line.find('%') != std::string::npos || line.find("tile") != std::string::npos)
      if (std::regex_search(line, isa_ext)) users.insert(fn);
  }
  pclose(p);
  ASSERT_GT(lines, 10000u) << "objdump produced almost nothing; the scan would be vacuous";
  // The kernels behind run-time dispatch: AVX-512 BF16 and AMX tiles (target attributes), and the
  // AVX-512 variant of every attention kernel (attention_variants.h: `#pragma GCC target` over the
  // namespace attn_avx512, entered only when active_isa() >= avx512).
  const std::regex allowed(R"(atl::cpu::\(anonymous namespace\)::(micro_kernel|block_32x32|load_config|release_tiles)\(.*)");
  const std::regex attention_variant(R"(atl::cpu::attn_avx512::.*)");
  // AdamW's AVX-512 loop (adamw_avx512.cpp), taken only when active_isa() >= avx512.
  const std::regex adamw_avx512(R"(atl::cpu::adamw_step_avx512\(.*)");
  // GELU's AVX-512 variant (gelu_avx512.cpp: `#pragma GCC target` over the namespace gelu_avx512,
  // entered only when active_isa() >= avx512; gelu_paths.h).
  const std::regex gelu_variant(R"(atl::cpu::gelu_avx512::.*)");
  bool saw_kernel = false, saw_adamw = false, saw_gelu = false;
  std::set<std::string> attention_seen;
  for (const std::string& u : users) {
    if (std::regex_match(u, allowed)) {
      saw_kernel = true;
    } else if (std::regex_match(u, adamw_avx512)) {
      saw_adamw = true;
    } else if (std::regex_match(u, gelu_variant)) {
      saw_gelu = true;
    } else if (std::regex_match(u, attention_variant)) {
      for (const char* k : {"causal_forward", "backward_dq", "backward_dkv", "ranged_forward", "ranged_backward",
                            "block_forward", "block_backward", "cached_forward"})
        if (u.find(std::string(k) + "(") != std::string::npos) attention_seen.insert(k);
    } else {
      ADD_FAILURE() << "AVX-512/AMX instructions in a function not behind run-time dispatch: " << u;
    }
  }
  EXPECT_TRUE(saw_kernel) << "the scan did not even find the AVX-512 BF16 kernel";
  EXPECT_TRUE(saw_adamw) << "AdamW's AVX-512 loop holds no AVX-512 code (did its target region take effect?)";
  EXPECT_TRUE(saw_gelu) << "GELU's AVX-512 variant holds no AVX-512 code (did its target region take effect?)";
  // Each attention kernel's AVX-512 variant really is AVX-512 code (the pragma took effect); its
  // AVX2 variant (attn_avx2) is generic code and so is covered by the check above.
  EXPECT_EQ(attention_seen.size(), 8u) << "attention kernels with AVX-512 code: " << attention_seen.size();
}
