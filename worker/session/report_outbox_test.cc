// ReportOutbox: order of delivery, retry until delivered, a failure empties the queue and is the
// answer of the next Enqueue, Drop forgets, Flush waits (and says what is left), Close stops.
#include "worker/session/report_outbox.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "gtest/gtest.h"

namespace latchkey {
namespace {

TEST(ReportOutboxTest, DeliversInOrderWhateverTheRetriesTake) {
  ReportOutbox box;
  std::mutex mu;
  std::vector<int> delivered;
  std::atomic<int> tries{0};
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(box.Enqueue([&, i] {
                     // The first report needs three tries (it retries by itself, as Report does).
                     if (i == 0) {
                       while (tries.fetch_add(1) < 2) absl::SleepFor(absl::Milliseconds(20));
                     }
                     std::lock_guard<std::mutex> lock(mu);
                     delivered.push_back(i);
                     return absl::OkStatus();
                   })
                    .ok());
  }
  EXPECT_TRUE(box.Flush(absl::Seconds(10)).ok());
  EXPECT_EQ(box.pending(), 0u);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(delivered, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(ReportOutboxTest, AFailureEmptiesTheQueueAndAnswersTheNextReport) {
  ReportOutbox box;
  std::atomic<int> sent{0};
  ASSERT_TRUE(box.Enqueue([] { return absl::AbortedError("fenced"); }).ok());
  // Queued behind the refused one, or refused at once if the failure came first.
  (void)box.Enqueue([&] {
    ++sent;
    return absl::OkStatus();
  });
  const absl::Status flushed = box.Flush(absl::Seconds(10));
  EXPECT_EQ(flushed.code(), absl::StatusCode::kAborted) << flushed;
  EXPECT_EQ(sent.load(), 0);  // nothing after the refused report is sent
  EXPECT_EQ(box.pending(), 0u);
  EXPECT_EQ(box.Enqueue([] { return absl::OkStatus(); }).code(), absl::StatusCode::kAborted);
  box.Drop();  // a new attempt
  EXPECT_TRUE(box.error().ok());
  EXPECT_TRUE(box.Enqueue([] { return absl::OkStatus(); }).ok());
  EXPECT_TRUE(box.Flush(absl::Seconds(10)).ok());
}

TEST(ReportOutboxTest, FlushSaysWhatIsLeftAndCloseStops) {
  ReportOutbox box;
  std::atomic<bool> release{false};
  ASSERT_TRUE(box.Enqueue([&] {
                   while (!release) absl::SleepFor(absl::Milliseconds(5));
                   return absl::OkStatus();
                 })
                  .ok());
  ASSERT_TRUE(box.Enqueue([] { return absl::OkStatus(); }).ok());
  const absl::Status flushed = box.Flush(absl::Milliseconds(100));
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  EXPECT_NE(flushed.message().find("2 reports not delivered"), absl::string_view::npos) << flushed;
  release = true;
  box.Close();
  EXPECT_EQ(box.Enqueue([] { return absl::OkStatus(); }).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace latchkey
