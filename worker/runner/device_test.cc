// The rank's device and backend from latchkey.device / latchkey.backend and the environment.
#include "worker/runner/device.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "worker/device/cuda_runtime.h"

namespace latchkey {
namespace {

JobSpec Spec(DeviceKind device, CommBackend backend) {
  JobSpec s;
  s.device = device;
  s.backend = backend;
  return s;
}

TEST(RankDevice, AutoIsNcclOnCudaAndTheCpuBackendsOnCpu) {
  EXPECT_EQ(BackendFor(Spec(DeviceKind::kCuda, CommBackend::kAuto)), CommBackend::kNccl);
  EXPECT_EQ(BackendFor(Spec(DeviceKind::kCuda, CommBackend::kNccl)), CommBackend::kNccl);
  EXPECT_EQ(BackendFor(Spec(DeviceKind::kCpu, CommBackend::kAuto)), CommBackend::kAuto);
  EXPECT_EQ(BackendFor(Spec(DeviceKind::kCpu, CommBackend::kGloo)), CommBackend::kGloo);
  EXPECT_EQ(BackendFor(Spec(DeviceKind::kCpu, CommBackend::kShm)), CommBackend::kShm);
}

TEST(RankDevice, CpuNeedsNoDevice) {
  auto p = PlaceRank(Spec(DeviceKind::kCpu, CommBackend::kAuto), WorkerEnv{}, 3, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->device.is_cpu());
}

TEST(RankDevice, CudaIsLocalRankDefaultingToRankModuloLocalWorldSize) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a CUDA device is present";
  WorkerEnv env;
  env.test_skip_device_check = true;
  auto p = PlaceRank(Spec(DeviceKind::kCuda, CommBackend::kAuto), env, 5, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->device, comm::Device::Cuda(1));
  EXPECT_EQ(p->backend, CommBackend::kNccl);
  env.local_rank = 3;
  p = PlaceRank(Spec(DeviceKind::kCuda, CommBackend::kAuto), env, 5, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->device, comm::Device::Cuda(3));
  env.test_skip_device_check = false;
  // Checked: no device here, named with the field.
  p = PlaceRank(Spec(DeviceKind::kCuda, CommBackend::kAuto), env, 5, 4);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("latchkey.device: \"cuda\": no CUDA device cuda:3"),
            std::string::npos)
      << p.status();
}

}  // namespace
}  // namespace latchkey
