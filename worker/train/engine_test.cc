// The engine's error contract on one thread, with scripted groups standing in for the peers:
// a collective failing inside autograd propagates as comm::CollectiveError (never turned into
// another code here); one failing at the boundary comes back as its Status.
#include "worker/train/engine.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "common/latch.h"
#include "tests/support/scripted_group.h"
#include "tests/support/specs.h"
#include "worker/comm/collective_error.h"

namespace latchkey {
namespace {

// TP 2 (rank 0 of 2) on the fixture's MQA model: 2 layers, so 4 TP all-reduces per forward and
// 4 per backward, then one coalesced K/V all-reduce and the norm's at the boundary. The weights
// come from the seed: reading the fixture's HF folder is the checkpoint module's
// (EngineOptions::load_init_from), not the engine's, and no count here depends on them.
JobSpec TpSpec() {
  testing::RunShape r;  // SGD on the fixture's model and tokens
  r.mb = 1;
  r.tp = 2;
  r.lr = 0.1;
  r.steps = 1;
  r.kv_reduce = "coalesced";
  testing::SpecParams p = testing::FixtureParams(r);
  p.seq_len = 8;
  p.init_from.clear();  // seeded weights (see above)
  auto spec = ParseJobSpec(testing::SpecJson(p), "/");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// The process groups of TP rank 0 whose TP all-reduces succeed `ok_tp_all_reduces` times.
comm::ProcessGroups ScriptedGroups(int ok_tp_all_reduces) {
  comm::ProcessGroups g;
  g.world_size = 2;
  g.tp = 2;
  g.stats = std::make_shared<comm::CollectiveStats>();
  g.world = std::make_shared<testing::ScriptedGroup>("world", 0, 2, g.stats);
  g.tp_group = std::make_shared<testing::ScriptedGroup>("tp", 0, 2, g.stats, ok_tp_all_reduces);
  g.dp_group = std::make_shared<comm::SingleRankGroup>("dp", comm::Device::Cpu(), g.stats);
  return g;
}

Latch FirstLatch(const JobSpec& spec) { return DecideLatch(spec, InitialPolicy(spec), 0, 0); }

TEST(EngineErrors, CollectiveFailingInBackwardPropagatesAsCollectiveError) {
  const JobSpec spec = TpSpec();
  comm::ProcessGroups groups = ScriptedGroups(/*ok_tp_all_reduces=*/4);  // the forward only
  auto engine = CreateEngine(spec, &groups);
  ASSERT_TRUE(engine.ok()) << engine.status();
  try {
    auto report = (*engine)->RunWindow(FirstLatch(spec));
    FAIL() << "window finished: " << report.status();
  } catch (const comm::CollectiveError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded) << e.status();
    EXPECT_NE(e.status().message().find("all_reduce on group 'tp'"), std::string::npos)
        << e.status();
  }
}

TEST(EngineErrors, CollectiveFailingAtTheBoundaryIsItsStatus) {
  const JobSpec spec = TpSpec();
  comm::ProcessGroups groups = ScriptedGroups(/*ok_tp_all_reduces=*/8);  // forward + backward
  auto engine = CreateEngine(spec, &groups);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto report = (*engine)->RunWindow(FirstLatch(spec));  // the K/V all-reduce fails
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDeadlineExceeded) << report.status();
}

TEST(EngineErrors, WindowRunsWithScriptedPeers) {
  const JobSpec spec = TpSpec();
  comm::ProcessGroups groups = ScriptedGroups(/*ok_tp_all_reduces=*/1000);
  auto engine = CreateEngine(spec, &groups);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto report = (*engine)->RunWindow(FirstLatch(spec));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->kv_allreduce_calls, 1);
  EXPECT_EQ(report->collective_calls.at("all_reduce/tp"), 4 + 4 + 1 + 1);
}

TEST(EngineErrors, DeviceWithoutKernelsIsUnimplemented) {
  if (at::hasCUDA()) {
    GTEST_SKIP() << "this libtorch has CUDA kernels: the refusal is a CPU-only libtorch's";
  }
  const JobSpec spec = TpSpec();
  comm::ProcessGroups groups = ScriptedGroups(1000);
  EngineOptions options;
  options.device = comm::Device::Cuda(0);
  auto engine = CreateEngine(spec, &groups, options);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnimplemented) << engine.status();
  EXPECT_NE(engine.status().message().find("cuda:0"), std::string::npos) << engine.status();
}

}  // namespace
}  // namespace latchkey
