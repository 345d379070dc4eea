#include <gtest/gtest.h>

#include <string>

#include "core/checksum.h"

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) check value and an all-zero block.
  EXPECT_EQ(atl::crc32c(std::string("123456789")), 0xE3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(atl::crc32c(zeros), 0x8A9136AAu);
}

TEST(Crc32c, DetectsOneFlippedBit) {
  std::string s(1000, 'a');
  uint32_t a = atl::crc32c(s);
  s[517] ^= 0x10;
  EXPECT_NE(a, atl::crc32c(s));
}
