// CoresOfCpuMax's reading of cgroup v2 `cpu.max`, and CgroupCpuQuotaCores on a cgroup tree made
// of real files: the tightest quota of the group and its ancestors counts.
#include "common/cpu_quota.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

TEST(CpuQuota, CpuMaxIsWholeCoresRoundedUp) {
  EXPECT_EQ(CoresOfCpuMax("400000 100000\n"), 4);
  EXPECT_EQ(CoresOfCpuMax("150000 100000"), 2);
  EXPECT_EQ(CoresOfCpuMax("50000 100000"), 1);
  EXPECT_EQ(CoresOfCpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(CoresOfCpuMax(""), std::nullopt);
  EXPECT_EQ(CoresOfCpuMax("12x 100000"), std::nullopt);
  EXPECT_EQ(CoresOfCpuMax("100000 0"), std::nullopt);
}

TEST(CpuQuota, TheTightestQuotaOfTheGroupAndItsAncestorsCounts) {
  testing::ScopedTempDir dir("cgroup");
  const std::filesystem::path root = dir.path();
  std::filesystem::create_directories(root / "kubepods/pod1/c1");
  std::ofstream(root / "kubepods/cpu.max") << "max 100000\n";
  std::ofstream(root / "kubepods/pod1/cpu.max") << "300000 100000\n";
  std::ofstream(root / "kubepods/pod1/c1/cpu.max") << "max 100000\n";
  std::ofstream(root / "self") << "0::/kubepods/pod1/c1\n";
  EXPECT_EQ(CgroupCpuQuotaCores(root / "self", root), 3);
  std::ofstream(root / "kubepods/cpu.max") << "200000 100000\n";
  EXPECT_EQ(CgroupCpuQuotaCores(root / "self", root), 2);
  // No quota anywhere; cgroup v1 (no "0::" line).
  std::ofstream(root / "unlimited") << "0::/\n";
  EXPECT_EQ(CgroupCpuQuotaCores(root / "unlimited", root), std::nullopt);
  std::ofstream(root / "v1") << "4:cpu,cpuacct:/kubepods/pod1\n";
  EXPECT_EQ(CgroupCpuQuotaCores(root / "v1", root), std::nullopt);
}

}  // namespace
}  // namespace latchkey
