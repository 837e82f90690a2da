#include "worker/checkpoint/train_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/files.h"

namespace latchkey {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// One rank's file: a few F32 values and U8 bytes that depend on the rank and step.
StFile RankFile(int rank, int64_t step) {
  StFile f;
  StTensor params;
  params.name = "params";
  params.dtype = StDtype::kF32;
  params.shape = {3};
  const float v[3] = {1.5f * rank, -2.0f, static_cast<float>(step)};
  params.data.assign(reinterpret_cast<const char*>(v), sizeof(v));
  StTensor rng;
  rng.name = "rng.local";
  rng.dtype = StDtype::kU8;
  rng.shape = {4};
  rng.data = std::string("\x01\x02\x03", 3) + static_cast<char>(rank);
  f.tensors = {params, rng};
  f.metadata["rank"] = std::to_string(rank);
  f.metadata["step"] = std::to_string(step);
  return f;
}

CheckpointManifest Manifest(int64_t step, int world, const std::string& job = "job-a") {
  CheckpointManifest m;
  m.job_id = job;
  m.step = step;
  m.attempt = 2;
  m.latch_generation = 3;
  m.next_window = step + 1;
  m.next_first_micro_batch = 4 * (step + 1);
  m.world_size = world;
  m.tp = world;
  m.dp = 1;
  m.zero_stage = 1;
  m.bf16 = true;
  m.optimizer = "AdamW";
  m.compute_threads = 1;
  m.model.n_layer = 3;
  m.model.resid_pdrop = 0.1;
  m.created_unix_seconds = 1700000000;
  return m;
}

// Writes every rank's file into the attempt's temporary folder and commits step `step`.
absl::StatusOr<std::string> Save(const std::string& root, int64_t step, int world,
                                 const std::string& job = "job-a", int64_t attempt = 2) {
  const std::string temp = JoinPath(root, CheckpointTempDirName(step, attempt));
  CheckpointManifest m = Manifest(step, world, job);
  m.attempt = attempt;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<CheckpointFileEntry> e = WriteCheckpointRankFile(temp, r, RankFile(r, step));
    if (!e.ok()) return e.status();
    m.files.push_back(*e);
  }
  return CommitCheckpoint(root, temp, m);
}

TEST(TrainCheckpointTest, NamesAndSha256) {
  EXPECT_EQ(CheckpointStepDirName(11), "step-00000011");
  EXPECT_EQ(CheckpointTempDirName(15, 2), ".step-00000015.a2.tmp");
  EXPECT_EQ(CheckpointRankFileName(1), "rank-00001.safetensors");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TrainCheckpointTest, CommitAndVerifyRoundTrip) {
  const testing::ScopedTempDir root("train-ckpt");
  absl::StatusOr<std::string> sha = Save(root.path(), 11, 2);
  ASSERT_TRUE(sha.ok()) << sha.status();
  const std::string dir = root / "step-00000011";
  EXPECT_FALSE(fs::exists(root / ".step-00000011.a2.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/manifest.json.tmp"));
  absl::StatusOr<std::string> text = ReadWholeFile(dir + "/manifest.json");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Sha256Hex(*text), *sha);

  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(dir, *sha);
  ASSERT_TRUE(m.ok()) << m.status();
  const CheckpointManifest want = Manifest(11, 2);
  EXPECT_EQ(m->job_id, "job-a");
  EXPECT_EQ(m->step, 11);
  EXPECT_EQ(m->attempt, 2);
  EXPECT_EQ(m->latch_generation, 3);
  EXPECT_EQ(m->next_window, 12);
  EXPECT_EQ(m->next_first_micro_batch, 48);
  EXPECT_EQ(m->world_size, 2);
  EXPECT_EQ(m->tp, 2);
  EXPECT_EQ(m->zero_stage, 1);
  EXPECT_TRUE(m->bf16);
  EXPECT_EQ(m->optimizer, "AdamW");
  EXPECT_EQ(m->model.n_layer, 3);
  EXPECT_EQ(m->model.resid_pdrop, 0.1);
  EXPECT_EQ(m->created_unix_seconds, 1700000000);
  ASSERT_EQ(m->files.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const std::string bytes = *ReadWholeFile(JoinPath(dir, CheckpointRankFileName(r)));
    EXPECT_EQ(m->files[r].name, CheckpointRankFileName(r));
    EXPECT_EQ(m->files[r].bytes, static_cast<int64_t>(bytes.size()));
    EXPECT_EQ(m->files[r].sha256, Sha256Hex(bytes));
    absl::StatusOr<StFile> f = ReadCheckpointRankFile(dir, r);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->metadata.at("rank"), std::to_string(r));
    const StTensor* p = f->Find("params");
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->data, RankFile(r, 11).tensors[0].data);
    const StTensor* rng = f->Find("rng.local");
    ASSERT_NE(rng, nullptr);
    EXPECT_EQ(rng->dtype, StDtype::kU8);
    EXPECT_EQ(rng->data, RankFile(r, 11).tensors[1].data);
  }
}

TEST(TrainCheckpointTest, FlippedByteIsDataLossNamingTheFile) {
  const testing::ScopedTempDir root("train-ckpt");
  ASSERT_TRUE(Save(root.path(), 3, 2).ok());
  const std::string dir = root / "step-00000003";
  const std::string victim = dir + "/rank-00001.safetensors";
  std::string bytes = *ReadWholeFile(victim);
  bytes[bytes.size() - 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomically(victim, bytes).ok());
  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(dir, "");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
  EXPECT_THAT(Msg(m.status()), HasSubstr("rank-00001.safetensors"));
  EXPECT_THAT(Msg(m.status()), HasSubstr("SHA-256"));

  // A truncated file is refused by its size.
  bytes.pop_back();
  ASSERT_TRUE(WriteFileAtomically(victim, bytes).ok());
  m = VerifyCheckpoint(dir, "");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
  EXPECT_THAT(Msg(m.status()), HasSubstr("rank-00001.safetensors"));
  EXPECT_THAT(Msg(m.status()), HasSubstr("bytes"));
  // The damaged checkpoint is not chosen.
  absl::StatusOr<std::optional<int64_t>> newest = NewestValidCheckpoint(root.path(), "");
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_FALSE(newest->has_value());
}

TEST(TrainCheckpointTest, WrongExpectedManifestShaIsRefused) {
  const testing::ScopedTempDir root("train-ckpt");
  absl::StatusOr<std::string> sha = Save(root.path(), 5, 1);
  ASSERT_TRUE(sha.ok()) << sha.status();
  std::string wrong = *sha;
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(root / "step-00000005", wrong);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
  EXPECT_THAT(Msg(m.status()), HasSubstr("manifest.json"));
  EXPECT_THAT(Msg(m.status()), HasSubstr(wrong));
  EXPECT_TRUE(VerifyCheckpoint(root / "step-00000005", *sha).ok());
}

TEST(TrainCheckpointTest, MissingManifestAndTempFoldersAreSkipped) {
  const testing::ScopedTempDir root("train-ckpt");
  ASSERT_TRUE(Save(root.path(), 2, 2).ok());
  ASSERT_TRUE(Save(root.path(), 4, 2).ok());
  // step 4 loses its manifest: partial.
  fs::remove(root / "step-00000004/manifest.json");
  EXPECT_EQ(VerifyCheckpoint(root / "step-00000004", "").status().code(),
            absl::StatusCode::kNotFound);
  // A complete-looking folder of a later step that was never renamed (attempt 3 died).
  const std::string temp = root / CheckpointTempDirName(9, 3);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(WriteCheckpointRankFile(temp, r, RankFile(r, 9)).ok());
  absl::StatusOr<std::optional<int64_t>> newest = NewestValidCheckpoint(root.path(), "");
  ASSERT_TRUE(newest.ok()) << newest.status();
  ASSERT_TRUE(newest->has_value());
  EXPECT_EQ(**newest, 2);
  // The job filter.
  ASSERT_TRUE(Save(root.path(), 7, 2, "job-b").ok());
  EXPECT_EQ(**NewestValidCheckpoint(root.path(), ""), 7);
  EXPECT_EQ(**NewestValidCheckpoint(root.path(), "job-b"), 7);
  EXPECT_EQ(**NewestValidCheckpoint(root.path(), "job-a"), 2);
  EXPECT_FALSE(NewestValidCheckpoint(root.path(), "job-c")->has_value());
  // No folder at all: none.
  EXPECT_FALSE(NewestValidCheckpoint(root / "absent", "")->has_value());
}

TEST(TrainCheckpointTest, CommitReplacesACommittedFolderOfTheSameStep) {
  const testing::ScopedTempDir root("train-ckpt");
  absl::StatusOr<std::string> first = Save(root.path(), 6, 2, "job-a", 1);
  ASSERT_TRUE(first.ok());
  absl::StatusOr<std::string> second = Save(root.path(), 6, 2, "job-a", 2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second);  // the attempt differs
  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(root / "step-00000006", *second);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->attempt, 2);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(root.path())) {
    ++entries;
    EXPECT_EQ(e.path().filename().string(), "step-00000006");
  }
  EXPECT_EQ(entries, 1);
}

TEST(TrainCheckpointTest, PruneKeepsTheNewestAndTheProtectedStep) {
  const testing::ScopedTempDir root("train-ckpt");
  for (int64_t s : {1, 3, 5, 7, 9}) ASSERT_TRUE(Save(root.path(), s, 1).ok());
  ASSERT_TRUE(
      WriteCheckpointRankFile(root / CheckpointTempDirName(11, 1), 0, RankFile(0, 11)).ok());
  ASSERT_TRUE(PruneCheckpoints(root.path(), 2, /*protect_step=*/3).ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names,
              ::testing::UnorderedElementsAre("step-00000003", "step-00000007", "step-00000009"));
  EXPECT_TRUE(VerifyCheckpoint(root / "step-00000009", "").ok());
  // keep 0 still keeps the newest committed checkpoint.
  ASSERT_TRUE(PruneCheckpoints(root.path(), 0, -1).ok());
  names.clear();
  for (const auto& e : fs::directory_iterator(root.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("step-00000009"));
}

TEST(TrainCheckpointTest, MalformedManifestIsDataLoss) {
  const testing::ScopedTempDir root("train-ckpt");
  ASSERT_TRUE(Save(root.path(), 1, 1).ok());
  ASSERT_TRUE(WriteFileAtomically(root / "step-00000001/manifest.json", "{\"format\": 1").ok());
  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(root / "step-00000001", "");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
  EXPECT_THAT(Msg(m.status()), HasSubstr("manifest.json"));
}

TEST(TrainCheckpointTest, AnotherLayoutFitsAnotherJobOptimizerOrModelIsRefused) {
  const CheckpointManifest want = Manifest(4, 2);
  EXPECT_TRUE(CheckManifestFits("d", want, want, "job-a").ok());
  EXPECT_TRUE(CheckManifestFits("d", want, want, "").ok());
  const auto refused = [&](CheckpointManifest m, const std::string& job) {
    absl::Status st = CheckManifestFits("d", m, want, job);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    return Msg(st);
  };
  EXPECT_THAT(refused(want, "job-b"), HasSubstr("checkpoint d: job_id job-a, this job has job-b"));
  // Any layout loads any checkpoint of the same job, optimizer and model.
  CheckpointManifest m = want;
  m.world_size = 4;
  m.tp = 1;
  m.dp = 4;
  m.zero_stage = 0;
  m.bf16 = false;
  EXPECT_TRUE(CheckManifestFits("d", m, want, "job-a").ok());
  m = want;
  m.optimizer = "SGD";
  EXPECT_THAT(refused(m, ""), HasSubstr("optimizer SGD, this job has AdamW"));
  m = want;
  m.model.attn_pdrop = 0.2;
  EXPECT_THAT(refused(m, ""), HasSubstr("model "));
}

TEST(TrainCheckpointTest, ResumePointKeepsTheStreamPositionAcrossDp) {
  CheckpointManifest m = Manifest(2, 4);
  m.dp = 2;
  m.tp = 2;
  m.next_first_micro_batch = 12;  // 3 windows of 4 micro-batches at dp 2
  m.next_first_sample = 12 * 2 * 2;
  ResumePoint same = ResumePointFor(m, 2, 2);
  EXPECT_EQ(same.next_window, 3);
  EXPECT_EQ(same.next_first_micro_batch, 12);
  EXPECT_EQ(same.next_first_sample, 48);
  ResumePoint dp1 = ResumePointFor(m, 1, 2);
  EXPECT_EQ(dp1.next_first_micro_batch, 24);
  EXPECT_EQ(dp1.next_first_sample, 48);
  m.version = 1;
  m.next_first_sample = -1;  // version 1: derived from the writing layout
  ResumePoint v1 = ResumePointFor(m, 4, 2);
  EXPECT_EQ(v1.next_first_sample, 48);
  EXPECT_EQ(v1.next_first_micro_batch, 6);
}

TEST(TrainCheckpointTest, Version1ManifestsStillParse) {
  const testing::ScopedTempDir root("train-ckpt");
  const std::string temp = JoinPath(root.path(), CheckpointTempDirName(3, 1));
  CheckpointManifest m = Manifest(3, 1);
  m.version = 1;
  m.files.push_back(*WriteCheckpointRankFile(temp, 0, RankFile(0, 3)));
  ASSERT_TRUE(CommitCheckpoint(root.path(), temp, m).ok());
  const std::string text = *ReadWholeFile(root / "step-00000003/manifest.json");
  EXPECT_THAT(text, HasSubstr("\"latchkey-checkpoint/1\""));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("next_first_sample")));
  absl::StatusOr<CheckpointManifest> back = VerifyCheckpoint(root / "step-00000003", "");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version, 1);
  EXPECT_EQ(back->next_first_sample, -1);
  EXPECT_TRUE(back->tensors.empty());
}

}  // namespace
}  // namespace latchkey
