// The counting CPU allocator against known sizes: what at::empty asks for is charged to the
// bound account and credited back on free (on any thread), the high-water mark resets to the
// bytes live, accounts are separate, and libtorch's raw_allocate path keeps working.
#include "worker/memory/memory.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <thread>

namespace latchkey::memory {
namespace {

class CountingAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(InstallCountingCpuAllocator().ok()); }
};

TEST_F(CountingAllocatorTest, ChargesAndCreditsKnownSizes) {
  EXPECT_TRUE(CountingCpuAllocatorInstalled());
  MemoryAccount* account = NewAccount();
  ScopedAccount bind(account);
  EXPECT_EQ(account->live_bytes(), 0);
  {
    at::Tensor a = at::empty({1000}, at::kFloat);   // 4000 bytes
    at::Tensor b = at::empty({3, 7}, at::kDouble);  // 168 bytes
    EXPECT_EQ(account->live_bytes(), 4168);
    EXPECT_EQ(account->peak_bytes(), 4168);
    EXPECT_EQ(account->allocations(), 2);
    a = at::Tensor();
    EXPECT_EQ(account->live_bytes(), 168);
    EXPECT_EQ(account->peak_bytes(), 4168);  // the high-water mark stays
    account->ResetPeak();
    EXPECT_EQ(account->peak_bytes(), 168);
    at::Tensor c = at::empty({10}, at::kByte);
    EXPECT_EQ(account->peak_bytes(), 178);
  }
  EXPECT_EQ(account->live_bytes(), 0);
  EXPECT_EQ(account->peak_bytes(), 178);
  // Zero bytes are not an allocation.
  at::Tensor empty = at::empty({0}, at::kFloat);
  EXPECT_EQ(account->allocations(), 3);
}

TEST_F(CountingAllocatorTest, AccountsAreSeparateAndNest) {
  MemoryAccount* outer = NewAccount();
  MemoryAccount* inner = NewAccount();
  ScopedAccount bind_outer(outer);
  at::Tensor a = at::zeros({256}, at::kFloat);
  {
    ScopedAccount bind_inner(inner);
    EXPECT_EQ(&CurrentAccount(), inner);
    at::Tensor b = at::zeros({64}, at::kFloat);
    EXPECT_EQ(inner->live_bytes(), 256);
    // A result is charged where it is computed: a clone of `a` allocates 1024 bytes here.
    at::Tensor c = a.clone();
    EXPECT_EQ(inner->live_bytes(), 256 + 1024);
  }
  EXPECT_EQ(&CurrentAccount(), outer);
  EXPECT_EQ(outer->live_bytes(), 1024);
  EXPECT_EQ(inner->live_bytes(), 0);
  EXPECT_EQ(inner->peak_bytes(), 1280);
}

TEST_F(CountingAllocatorTest, FreeOnAnotherThreadCreditsTheAllocatingAccount) {
  MemoryAccount* account = NewAccount();
  at::Tensor t;
  {
    ScopedAccount bind(account);
    t = at::empty({500}, at::kInt);
  }
  EXPECT_EQ(account->live_bytes(), 2000);
  const int64_t process_before = ProcessAccount().live_bytes();
  std::thread([&] { t = at::Tensor(); }).join();
  EXPECT_EQ(account->live_bytes(), 0);
  EXPECT_EQ(ProcessAccount().live_bytes(), process_before);
}

TEST_F(CountingAllocatorTest, RawAllocatePathAndAlignment) {
  MemoryAccount* account = NewAccount();
  ScopedAccount bind(account);
  c10::Allocator* alloc = c10::GetCPUAllocator();
  void* p = alloc->raw_allocate(96);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(account->live_bytes(), 96);
  alloc->raw_deallocate(p);
  EXPECT_EQ(account->live_bytes(), 0);
  at::Tensor t = at::empty({17}, at::kFloat);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
}

TEST_F(CountingAllocatorTest, CpuMeterReadsItsAccount) {
  auto meter = MakeMemoryMeter(/*cuda=*/false, 0);
  ASSERT_TRUE(meter.ok()) << meter.status();
  ASSERT_NE((*meter)->account(), nullptr);
  ScopedAccount bind((*meter)->account());
  at::Tensor a = at::empty({128}, at::kFloat);
  (*meter)->ResetPeak();
  {
    at::Tensor b = at::empty({256}, at::kFloat);
    EXPECT_EQ((*meter)->AllocatedBytes(), 512 + 1024);
  }
  const MemoryReading r = (*meter)->Read();
  EXPECT_EQ(r.allocated_bytes, 512);
  EXPECT_EQ(r.peak_bytes, 512 + 1024);
  EXPECT_EQ(r.reserved_bytes, 0);
}

TEST(CudaMemoryMeter, RefusedWithoutTorchCuda) {
#if LATCHKEY_TORCH_CUDA
  GTEST_SKIP() << "this build's libtorch has CUDA";
#else
  auto meter = MakeMemoryMeter(/*cuda=*/true, 1);
  EXPECT_EQ(meter.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(meter.status().message()).find("cuda:1"), std::string::npos);
#endif
}

}  // namespace
}  // namespace latchkey::memory
