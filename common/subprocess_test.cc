#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <optional>
#include <thread>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

// Polls until the child ended (at most 10 s).
std::optional<ExitInfo> PollUntilEnded(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    if (auto e = PollExit(pid)) return e;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

TEST(Subprocess, PollExitTellsAnExitCodeFromASignal) {
  auto exited = Spawn({{"/bin/sh", "-c", "exit 75"}, {}, ""});
  ASSERT_TRUE(exited.ok()) << exited.status();
  const auto e = PollUntilEnded(*exited);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, 75);
  EXPECT_EQ(e->signal, 0);
  EXPECT_EQ(e->combined(), 75);
  EXPECT_EQ(DescribeExit(*e), "exited with code 75");

  auto sleeping = Spawn({{"/bin/sleep", "30"}, {}, ""});
  ASSERT_TRUE(sleeping.ok()) << sleeping.status();
  EXPECT_FALSE(PollExit(*sleeping).has_value());  // still running
  ASSERT_EQ(kill(*sleeping, SIGKILL), 0);
  const auto k = PollUntilEnded(*sleeping);
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->signal, SIGKILL);
  EXPECT_EQ(k->combined(), 128 + SIGKILL);
  EXPECT_EQ(DescribeExit(*k), "killed by signal 9");
  // Reaped: no longer a child.
  EXPECT_EQ(PollExit(*sleeping)->code, -1);
}

TEST(Subprocess, AppendLogKeepsWhatAnEarlierRunWrote) {
  testing::ScopedTempDir dir("subprocess");
  const std::string log = dir / "out.log";
  SpawnOptions first{{"/bin/sh", "-c", "echo first"}, {}, log};
  ASSERT_EQ(WaitOrKill(*Spawn(first), std::chrono::seconds(10)), 0);
  SpawnOptions again{{"/bin/sh", "-c", "echo again"}, {}, log};
  again.append_log = true;
  ASSERT_EQ(WaitOrKill(*Spawn(again), std::chrono::seconds(10)), 0);
  EXPECT_EQ(testing::ReadText(log), "first\nagain\n");
  ASSERT_EQ(WaitOrKill(*Spawn(first), std::chrono::seconds(10)), 0);
  EXPECT_EQ(testing::ReadText(log), "first\n");  // truncated without append_log
}

}  // namespace
}  // namespace latchkey
