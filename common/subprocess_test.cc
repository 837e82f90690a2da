#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
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

// The kernel sends the parent-death signal when the forking *thread* ends: a child spawned from
// a thread that has ended since (a supervisor's restart loop) must keep running.
TEST(Subprocess, ParentDeathSignalOutlivesTheSpawningThread) {
  absl::StatusOr<pid_t> child = absl::UnknownError("not spawned");
  std::thread([&] {
    SpawnOptions o{{"/bin/sleep", "30"}, {}, ""};
    o.parent_death_signal = SIGTERM;
    child = Spawn(o);
  }).join();
  ASSERT_TRUE(child.ok()) << child.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(PollExit(*child).has_value()) << "the child ended with its spawning thread";
  ASSERT_EQ(kill(*child, SIGKILL), 0);
  EXPECT_EQ(PollUntilEnded(*child)->signal, SIGKILL);
}

TEST(Subprocess, OwnProcessGroupOnBothPaths) {
  for (int death_signal : {0, SIGTERM}) {
    SpawnOptions o{{"sleep", "30"}, {}, ""};  // PATH lookup on both paths
    o.own_process_group = true;
    o.parent_death_signal = death_signal;
    auto pid = Spawn(o);
    ASSERT_TRUE(pid.ok()) << pid.status();
    EXPECT_EQ(getpgid(*pid), *pid) << "death signal " << death_signal;
    EXPECT_NE(getpgid(*pid), getpgrp());
    // A signal to this process's group does not reach it; one to its own group does.
    ASSERT_EQ(kill(-*pid, SIGKILL), 0);
    EXPECT_EQ(PollUntilEnded(*pid)->signal, SIGKILL);
  }
}

TEST(Subprocess, ForkPathReportsAProgramThatCannotStart) {
  SpawnOptions missing{{"latchkey-no-such-program"}, {}, ""};
  missing.parent_death_signal = SIGTERM;
  const auto pid = Spawn(missing);
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kNotFound) << pid.status();
  EXPECT_NE(pid.status().message().find("latchkey-no-such-program"), std::string::npos);

  testing::ScopedTempDir dir("subprocess");
  SpawnOptions not_executable{{dir / "no-x.sh"}, {}, ""};
  std::ofstream(dir / "no-x.sh") << "#!/bin/sh\n";  // mode 0644: not executable
  not_executable.parent_death_signal = SIGTERM;
  EXPECT_FALSE(Spawn(not_executable).ok());

  // And a log is written as on the other path.
  SpawnOptions echo{{"/bin/sh", "-c", "echo forked"}, {}, dir / "out.log"};
  echo.parent_death_signal = SIGTERM;
  ASSERT_EQ(WaitOrKill(*Spawn(echo), std::chrono::seconds(10)), 0);
  EXPECT_EQ(testing::ReadText(dir / "out.log"), "forked\n");
}

}  // namespace
}  // namespace latchkey
