// CRC-32C against RFC 3720's vectors, TFRecord framing and its truncated tail, and the event
// files the writer leaves (read back with the generated protos).
#include "worker/tensorboard/event_writer.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensorboard/event.pb.h"
#include "worker/tensorboard/crc32c.h"
#include "worker/tensorboard/tfrecord.h"

namespace latchkey::tensorboard {
namespace {

namespace fs = std::filesystem;

TEST(Crc32cTest, Rfc3720Vectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), inc(32, '\0'), dec(32, '\0');
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // the check value
  EXPECT_EQ(MaskCrc(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc(0x12345678u), ((0x12345678u >> 15) | (0x12345678u << 17)) + 0xa282ead8u);
}

TEST(TfRecordTest, FramingAndTruncatedTail) {
  const std::string a = FrameRecord("hello"), b = FrameRecord(std::string(300, 'x'));
  ASSERT_EQ(a.size(), 5u + 16u);
  EXPECT_EQ(std::string(a.data(), 8), std::string("\x05\0\0\0\0\0\0\0", 8));
  uint32_t hcrc = 0;
  std::memcpy(&hcrc, a.data() + 8, 4);
  EXPECT_EQ(hcrc, MaskedCrc32c(a.data(), 8));
  EXPECT_EQ(a.substr(12, 5), "hello");
  uint32_t dcrc = 0;
  std::memcpy(&dcrc, a.data() + 17, 4);
  EXPECT_EQ(dcrc, MaskedCrc32c("hello", 5));

  const std::string both = a + b;
  for (size_t cut = 0; cut <= both.size(); ++cut) {
    std::vector<std::string> got;
    bool truncated = false;
    ASSERT_TRUE(ReadRecords(absl::string_view(both.data(), cut), &got, &truncated).ok());
    const size_t whole = cut >= both.size() ? 2 : cut >= a.size() ? 1 : 0;
    ASSERT_EQ(got.size(), whole) << cut;
    EXPECT_EQ(truncated, cut != 0 && cut != a.size() && cut != both.size()) << cut;
    if (whole >= 1) {
      EXPECT_EQ(got[0], "hello");
    }
    if (whole == 2) {
      EXPECT_EQ(got[1], std::string(300, 'x'));
    }
  }
  std::string bad = both;
  bad[14] ^= 1;  // a data byte of the first record
  std::vector<std::string> got;
  bool truncated = false;
  EXPECT_EQ(ReadRecords(bad, &got, &truncated).code(), absl::StatusCode::kDataLoss);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<Event> Events(const std::string& path) {
  std::vector<std::string> records;
  bool truncated = false;
  EXPECT_TRUE(ReadRecords(ReadFile(path), &records, &truncated).ok());
  EXPECT_FALSE(truncated);
  std::vector<Event> out(records.size());
  for (size_t i = 0; i < records.size(); ++i) EXPECT_TRUE(out[i].ParseFromString(records[i]));
  return out;
}

// A diverged step's loss and grad norm are written as they are (NaN, +Inf: TensorBoard plots
// them as such); the step's other scalars as on any step.
TEST(EventWriterTest, NonFiniteScalarsAreWrittenAsTheyAre) {
  const std::string dir = ::testing::TempDir() + "/tb-nan-" + std::to_string(getpid());
  fs::remove_all(dir);
  StepReport r;
  r.step = 1;
  r.loss = std::nan("");
  r.grad_norm = INFINITY;
  r.lr = 1e9;
  std::string path;
  {
    auto w = EventFileWriter::Open(dir, 1);
    ASSERT_TRUE(w.ok()) << w.status();
    path = (*w)->path();
    ASSERT_TRUE((*w)->WriteScalars(1, StepScalars(r)).ok());
  }
  const std::vector<Event> ev = Events(path);
  ASSERT_EQ(ev.size(), 3u);
  ASSERT_TRUE(ev[2].has_summary());
  EXPECT_EQ(ev[2].step(), 1);
  EXPECT_EQ(ev[2].summary().value(0).tag(), "loss");
  EXPECT_TRUE(std::isnan(ev[2].summary().value(0).simple_value()));
  EXPECT_EQ(ev[2].summary().value(1).tag(), "lr");
  EXPECT_EQ(ev[2].summary().value(1).simple_value(), 1e9f);
  EXPECT_EQ(ev[2].summary().value(2).tag(), "grad_norm");
  EXPECT_EQ(ev[2].summary().value(2).simple_value(), INFINITY);
}

TEST(EventWriterTest, FilesStartWithVersionAndSessionStartAndHoldOneValuePerScalar) {
  const std::string dir = ::testing::TempDir() + "/tb-" + std::to_string(getpid());
  fs::remove_all(dir);
  StepReport r;
  r.step = 0;
  r.loss = 5.25;
  r.lr = 1e-3;
  r.grad_norm = 0.5;
  r.tokens = 512;
  r.step_seconds = 0.25;
  r.collective_seconds = 0.05;
  r.kv_allreduce_calls = 1;
  r.peak_memory_bytes = 123456789;
  std::string first_path;
  {
    auto w = EventFileWriter::Open(dir + "/nested", 0);
    ASSERT_TRUE(w.ok()) << w.status();
    first_path = (*w)->path();
    ASSERT_TRUE((*w)->WriteScalars(0, StepScalars(r)).ok());
    r.step = 1;
    r.eval_loss = 5.0;
    r.checkpoint_seconds = 0.125;
    ASSERT_TRUE((*w)->WriteScalars(1, StepScalars(r)).ok());
  }
  const std::vector<Event> ev = Events(first_path);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].file_version(), "brain.Event:2");
  EXPECT_EQ(ev[1].session_log().status(), SessionLog::START);
  EXPECT_EQ(ev[1].step(), 0);
  ASSERT_TRUE(ev[2].has_summary());
  std::vector<std::string> tags;
  for (const auto& v : ev[2].summary().value()) tags.push_back(v.tag());
  EXPECT_EQ(tags, (std::vector<std::string>{"loss", "lr", "grad_norm", "tokens_per_second",
                                            "step_seconds", "kv_allreduce_calls",
                                            "collective_share", "peak_memory_bytes"}));
  EXPECT_EQ(ev[2].summary().value(0).simple_value(), 5.25f);
  EXPECT_EQ(ev[2].summary().value(3).simple_value(), 2048.0f);  // 512 tokens / 0.25 s
  EXPECT_EQ(ev[2].summary().value(6).simple_value(), static_cast<float>(0.05 / 0.25));
  EXPECT_EQ(ev[2].summary().value(7).simple_value(), static_cast<float>(123456789));
  EXPECT_EQ(ev[3].step(), 1);
  ASSERT_EQ(ev[3].summary().value_size(), 10);
  EXPECT_EQ(ev[3].summary().value(1).tag(), "eval_loss");
  EXPECT_EQ(ev[3].summary().value(8).tag(), "checkpoint_seconds");
  EXPECT_EQ(ev[3].summary().value(8).simple_value(), 0.125f);
  EXPECT_GT(ev[3].wall_time(), 1.6e9);

  // A resumed attempt: a new file, sorting after the first, starting at its resume step.
  auto w2 = EventFileWriter::Open(dir + "/nested", 1);
  ASSERT_TRUE(w2.ok()) << w2.status();
  EXPECT_NE((*w2)->path(), first_path);
  EXPECT_GT(fs::path((*w2)->path()).filename().string(), fs::path(first_path).filename().string());
  const std::vector<Event> ev2 = Events((*w2)->path());
  ASSERT_EQ(ev2.size(), 2u);
  EXPECT_EQ(ev2[1].session_log().status(), SessionLog::START);
  EXPECT_EQ(ev2[1].step(), 1);
  fs::remove_all(dir);
}

TEST(EventWriterTest, AnUnwritableDirNamesTheField) {
  const std::string file = ::testing::TempDir() + "/tb-file-" + std::to_string(getpid());
  std::ofstream(file) << "x";
  auto w = EventFileWriter::Open(file + "/sub", 0);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(std::string(w.status().message()).find("latchkey.tensorboard.dir"), std::string::npos)
      << w.status();
  fs::remove(file);
}

}  // namespace
}  // namespace latchkey::tensorboard
