#include "worker/checkpoint/train_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

// A uid per job id for the tests that do not care which (two jobs of one id get two explicitly).
std::string UidOf(const std::string& job) { return Sha256Hex(job).substr(0, 16); }

CheckpointManifest Manifest(int64_t step, int world, const std::string& job = "job-a",
                            const std::string& uid = "") {
  CheckpointManifest m;
  m.job_id = job;
  m.job_uid = uid;
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

// Writes every rank's file into the attempt's temporary folder and commits step `step` for job
// `job` with uid `uid` (default UidOf(job); "none": no uid).
absl::StatusOr<CommittedCheckpoint> Commit(const std::string& root, int64_t step, int world,
                                           const std::string& job = "job-a", int64_t attempt = 2,
                                           std::string uid = "") {
  if (uid.empty()) uid = UidOf(job);
  if (uid == "none") uid.clear();
  const std::string temp = JoinPath(root, CheckpointTempDirName(step, uid, attempt));
  CheckpointManifest m = Manifest(step, world, job, uid);
  m.attempt = attempt;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<CheckpointFileEntry> e = WriteCheckpointRankFile(temp, r, RankFile(r, step));
    if (!e.ok()) return e.status();
    m.files.push_back(*e);
  }
  return CommitCheckpoint(root, temp, m);
}

// Commit's manifest SHA-256.
absl::StatusOr<std::string> Save(const std::string& root, int64_t step, int world,
                                 const std::string& job = "job-a", int64_t attempt = 2,
                                 const std::string& uid = "") {
  absl::StatusOr<CommittedCheckpoint> c = Commit(root, step, world, job, attempt, uid);
  if (!c.ok()) return c.status();
  return c->manifest_sha256;
}

// The names in `root`, sorted.
std::vector<std::string> Names(const std::string& root) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(TrainCheckpointTest, NamesAndSha256) {
  EXPECT_EQ(CheckpointStepDirName(11), "step-00000011");
  EXPECT_EQ(CheckpointTempDirName(15, "", 2), ".step-00000015.a2.tmp");
  EXPECT_EQ(CheckpointTempDirName(15, "0123456789abcdef", 2),
            ".step-00000015.0123456789abcdef.a2.tmp");
  EXPECT_EQ(CheckpointStepDirName(11, "0123456789abcdef"), "step-00000011.0123456789abcdef");
  EXPECT_EQ(CheckpointStepDirName(11, ""), "step-00000011");
  EXPECT_EQ(ParseCheckpointDirName("step-00000011")->step, 11);
  EXPECT_EQ(ParseCheckpointDirName("step-00000011")->job_uid, "");
  EXPECT_EQ(ParseCheckpointDirName("step-00000011.0123456789abcdef")->job_uid, "0123456789abcdef");
  EXPECT_FALSE(ParseCheckpointDirName("step-00000011.x").has_value());
  EXPECT_FALSE(ParseCheckpointDirName(".step-00000011.a2.tmp").has_value());
  EXPECT_EQ(CheckpointRankFileName(1), "rank-00001.safetensors");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TrainCheckpointTest, CommitAndVerifyRoundTrip) {
  const testing::ScopedTempDir root("train-ckpt");
  absl::StatusOr<std::string> sha = Save(root.path(), 11, 2);
  ASSERT_TRUE(sha.ok()) << sha.status();
  const std::string dir = root / "step-00000011";
  EXPECT_FALSE(fs::exists(root / (".step-00000011." + UidOf("job-a") + ".a2.tmp")));
  EXPECT_FALSE(fs::exists(dir + "/manifest.json.tmp"));
  absl::StatusOr<std::string> text = ReadWholeFile(dir + "/manifest.json");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Sha256Hex(*text), *sha);

  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(dir, *sha);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->job_id, "job-a");
  EXPECT_EQ(m->job_uid, UidOf("job-a"));
  EXPECT_THAT(*text, HasSubstr("\"job_uid\": \"" + UidOf("job-a") + "\""));
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
  absl::StatusOr<std::optional<FoundCheckpoint>> newest = NewestValidCheckpoint(root.path(), "");
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
  const std::string temp = root / CheckpointTempDirName(9, UidOf("job-a"), 3);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(WriteCheckpointRankFile(temp, r, RankFile(r, 9)).ok());
  absl::StatusOr<std::optional<FoundCheckpoint>> newest = NewestValidCheckpoint(root.path(), "");
  ASSERT_TRUE(newest.ok()) << newest.status();
  ASSERT_TRUE(newest->has_value());
  EXPECT_EQ((*newest)->step, 2);
  EXPECT_EQ((*newest)->dir, root / "step-00000002");
  // The job filter.
  ASSERT_TRUE(Save(root.path(), 7, 2, "job-b").ok());
  EXPECT_EQ((*NewestValidCheckpoint(root.path(), ""))->step, 7);
  EXPECT_EQ((*NewestValidCheckpoint(root.path(), "job-b"))->step, 7);
  EXPECT_EQ((*NewestValidCheckpoint(root.path(), "job-a"))->step, 2);
  EXPECT_FALSE(NewestValidCheckpoint(root.path(), "job-c")->has_value());
  // No folder at all: none.
  EXPECT_FALSE(NewestValidCheckpoint(root / "absent", "")->has_value());
}

TEST(TrainCheckpointTest, NoRoomForARankFileOrTheManifestIsOutOfSpaceAndCommitsNothing) {
  const testing::ScopedTempDir root("train-ckpt");
  // /dev/full: every write fails with ENOSPC.
  const std::string temp = root / CheckpointTempDirName(5, UidOf("job-a"), 1);
  fs::create_directories(temp);
  fs::create_symlink("/dev/full", temp + "/" + CheckpointRankFileName(1));
  absl::StatusOr<CheckpointFileEntry> full = WriteCheckpointRankFile(temp, 1, RankFile(1, 5));
  ASSERT_FALSE(full.ok());
  EXPECT_TRUE(IsOutOfSpace(full.status())) << full.status();
  EXPECT_EQ(full.status().code(), absl::StatusCode::kInternal);  // as any write error
  EXPECT_THAT(std::string(full.status().message()),
              ::testing::HasSubstr("cannot write " + temp + "/rank-00001.safetensors: "));
  // Both files written, no room for the manifest: nothing committed, no manifest left.
  fs::remove(temp + "/" + CheckpointRankFileName(1));
  CheckpointManifest m = Manifest(5, 2, "job-a", UidOf("job-a"));
  for (int r = 0; r < 2; ++r) m.files.push_back(*WriteCheckpointRankFile(temp, r, RankFile(r, 5)));
  fs::create_symlink("/dev/full", temp + "/manifest.json.tmp");
  absl::StatusOr<CommittedCheckpoint> c = CommitCheckpoint(root.path(), temp, m);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsOutOfSpace(c.status())) << c.status();
  EXPECT_EQ(Names(temp),
            (std::vector<std::string>{"rank-00000.safetensors", "rank-00001.safetensors"}));
  EXPECT_FALSE(fs::exists(root / "step-00000005"));
  // Room again: the same folder commits.
  ASSERT_TRUE(CommitCheckpoint(root.path(), temp, m).ok());
  EXPECT_TRUE(VerifyCheckpoint(root / "step-00000005", "").ok());
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
  const CheckpointOwner job("job-a", UidOf("job-a"));
  ASSERT_TRUE(
      WriteCheckpointRankFile(root / CheckpointTempDirName(11, job.job_uid, 1), 0, RankFile(0, 11))
          .ok());
  ASSERT_TRUE(PruneCheckpoints(root.path(), job, 2, /*protect_step=*/3).ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names,
              ::testing::UnorderedElementsAre("step-00000003", "step-00000007", "step-00000009"));
  EXPECT_TRUE(VerifyCheckpoint(root / "step-00000009", "").ok());
  // keep 0 still keeps the newest committed checkpoint.
  ASSERT_TRUE(PruneCheckpoints(root.path(), job, 0, -1).ok());
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
  // Another job of the same id (another coordinator's): its uid differs. A manifest without one
  // (written before uids) is told apart by its SHA-256 only.
  m = want;
  m.job_uid = "00000000000000bb";
  EXPECT_THAT(Msg(CheckManifestFits("d", m, want, "job-a", "00000000000000aa")),
              HasSubstr("checkpoint d: job_uid 00000000000000bb, this job has 00000000000000aa"));
  EXPECT_TRUE(CheckManifestFits("d", m, want, "job-a", "00000000000000bb").ok());
  m.job_uid.clear();
  EXPECT_TRUE(CheckManifestFits("d", m, want, "job-a", "00000000000000aa").ok());
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
  const std::string temp = JoinPath(root.path(), CheckpointTempDirName(3, "", 1));
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

// Two jobs of the same id (two coordinators, each numbering its first job job-000001) and one
// checkpoint of a release before job uids share a folder.
constexpr char kJob[] = "job-000001";
constexpr char kUidA[] = "00000000000000aa";
constexpr char kUidB[] = "00000000000000bb";

TEST(CheckpointOwnership, PruningAmongInterleavedJobsRemovesOnlyTheJobsOwn) {
  const testing::ScopedTempDir root("ckpt-owner");
  const CheckpointOwner a(kJob, kUidA);
  const CheckpointOwner b(kJob, kUidB);
  ASSERT_TRUE(Save(root.path(), 4, 1, kJob, 1, "none").ok());  // the old release's
  for (int64_t s = 1; s <= 9; ++s) {
    ASSERT_TRUE(Save(root.path(), s, 1, kJob, 1, s % 2 == 1 ? kUidA : kUidB).ok()) << s;
  }
  const std::string b4 = std::string("step-00000004.") + kUidB;  // step-00000004 was taken
  EXPECT_EQ(Names(root.path()),
            (std::vector<std::string>{"step-00000001", "step-00000002", "step-00000003",
                                      "step-00000004", b4, "step-00000005", "step-00000006",
                                      "step-00000007", "step-00000008", "step-00000009"}));
  ASSERT_TRUE(PruneCheckpoints(root.path(), a, 2, -1).ok());
  EXPECT_EQ(Names(root.path()),
            (std::vector<std::string>{"step-00000002", "step-00000004", b4, "step-00000006",
                                      "step-00000007", "step-00000008", "step-00000009"}));
  ASSERT_TRUE(PruneCheckpoints(root.path(), b, 1, -1).ok());
  EXPECT_EQ(Names(root.path()), (std::vector<std::string>{"step-00000004", "step-00000007",
                                                          "step-00000008", "step-00000009"}));
  for (const std::string& n : Names(root.path())) EXPECT_TRUE(VerifyCheckpoint(root / n, "").ok());
  // Discovery agrees with pruning on whose each one is.
  EXPECT_EQ((*NewestValidCheckpoint(root.path(), a))->dir, root / "step-00000009");
  EXPECT_EQ((*NewestValidCheckpoint(root.path(), b))->dir, root / "step-00000008");
  absl::StatusOr<std::vector<FoundCheckpoint>> of_a = ListCheckpoints(root.path(), a);
  ASSERT_TRUE(of_a.ok()) << of_a.status();
  ASSERT_EQ(of_a->size(), 2u);
  EXPECT_EQ((*of_a)[0].step, 9);
  EXPECT_EQ((*of_a)[1].step, 7);
  EXPECT_EQ(ListCheckpoints(root.path(), CheckpointOwner(kJob))->size(), 4u);  // uid unknown
}

TEST(CheckpointOwnership, TwoJobsSavingTheSameStepBothKeepTheirCheckpoint) {
  const testing::ScopedTempDir root("ckpt-owner");
  const CheckpointOwner a(kJob, kUidA);
  const CheckpointOwner b(kJob, kUidB);
  absl::StatusOr<CommittedCheckpoint> a6 = Commit(root.path(), 6, 2, kJob, 1, kUidA);
  ASSERT_TRUE(a6.ok()) << a6.status();
  absl::StatusOr<CommittedCheckpoint> b6 = Commit(root.path(), 6, 2, kJob, 1, kUidB);
  ASSERT_TRUE(b6.ok()) << b6.status();
  const std::string plain = root / "step-00000006";
  const std::string named = root / (std::string("step-00000006.") + kUidB);
  EXPECT_EQ(a6->dir, plain);
  EXPECT_EQ(b6->dir, named);
  EXPECT_TRUE(VerifyCheckpoint(plain, a6->manifest_sha256).ok());
  EXPECT_EQ(VerifyCheckpoint(named, b6->manifest_sha256)->job_uid, kUidB);
  // Resume finds each job's folder of the step: by the SHA-256 the coordinator sends, or by
  // the owner.
  EXPECT_EQ(*FindCheckpointDir(root.path(), 6, a, a6->manifest_sha256), plain);
  EXPECT_EQ(*FindCheckpointDir(root.path(), 6, b, b6->manifest_sha256), named);
  EXPECT_EQ(*FindCheckpointDir(root.path(), 6, b, ""), named);
  EXPECT_EQ(*FindCheckpointDir(root.path(), 6, a, ""), plain);
  EXPECT_EQ(
      FindCheckpointDir(root.path(), 6, CheckpointOwner("job-000002", kUidA), "").status().code(),
      absl::StatusCode::kNotFound);
  // A later attempt of either job commits the step again: its own folder is replaced, the
  // other job's is not touched.
  absl::StatusOr<CommittedCheckpoint> b6_again = Commit(root.path(), 6, 2, kJob, 2, kUidB);
  ASSERT_TRUE(b6_again.ok()) << b6_again.status();
  EXPECT_EQ(b6_again->dir, named);
  absl::StatusOr<CommittedCheckpoint> a6_again = Commit(root.path(), 6, 2, kJob, 3, kUidA);
  ASSERT_TRUE(a6_again.ok()) << a6_again.status();
  EXPECT_EQ(a6_again->dir, plain);
  EXPECT_EQ(VerifyCheckpoint(plain, a6_again->manifest_sha256)->attempt, 3);
  EXPECT_EQ(VerifyCheckpoint(named, b6_again->manifest_sha256)->attempt, 2);
  EXPECT_EQ(Names(root.path()),
            (std::vector<std::string>{"step-00000006", "step-00000006." + std::string(kUidB)}));
  // A folder named after a uid holds that uid's manifest; anything else is refused.
  ASSERT_TRUE(RemoveTree(plain).ok());
  fs::rename(named, root / (std::string("step-00000006.") + kUidA));
  absl::StatusOr<CheckpointManifest> renamed =
      ReadCheckpointManifest(root / (std::string("step-00000006.") + kUidA), "");
  EXPECT_EQ(renamed.status().code(), absl::StatusCode::kDataLoss) << renamed.status();
  EXPECT_THAT(Msg(renamed.status()), HasSubstr("job_uid"));
}

TEST(CheckpointOwnership, AnotherJobsTemporaryFoldersSurvivePruning) {
  const testing::ScopedTempDir root("ckpt-owner");
  const CheckpointOwner a(kJob, kUidA);
  ASSERT_TRUE(Save(root.path(), 3, 1, kJob, 1, kUidA).ok());
  ASSERT_TRUE(Save(root.path(), 5, 1, kJob, 1, kUidA).ok());
  const std::vector<std::string> others = {
      CheckpointTempDirName(6, kUidB, 1),  // job B's save in flight
      CheckpointTempDirName(9, "", 1),     // a writer without a uid
      ".step-00000002.replaced.tmp",
  };
  const std::vector<std::string> own = {
      CheckpointTempDirName(7, kUidA, 1),  // an earlier attempt's, never committed
      std::string(".step-00000002.") + kUidA + ".replaced.tmp",
  };
  for (const auto* names : {&others, &own}) {
    for (const std::string& n : *names) {
      ASSERT_TRUE(WriteCheckpointRankFile(root / n, 0, RankFile(0, 6)).ok()) << n;
    }
  }
  ASSERT_TRUE(PruneCheckpoints(root.path(), a, 1, -1).ok());
  std::vector<std::string> want = others;
  want.push_back("step-00000005");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Names(root.path()), want);
  for (const std::string& n : others) {
    EXPECT_TRUE(IsRegularFile(JoinPath(root / n, CheckpointRankFileName(0)))) << n;
  }
}

TEST(CheckpointOwnership, AManifestWithoutAUidIsNeverTouched) {
  const testing::ScopedTempDir root("ckpt-owner");
  for (int64_t s : {1, 2}) ASSERT_TRUE(Save(root.path(), s, 1, kJob, 1, "none").ok());
  const std::string text = *ReadWholeFile(root / "step-00000001/manifest.json");
  EXPECT_THAT(text, ::testing::Not(HasSubstr("job_uid")));  // written only when there is one
  EXPECT_EQ(VerifyCheckpoint(root / "step-00000001", "")->job_uid, "");
  const CheckpointOwner a(kJob, kUidA);
  for (int64_t s : {2, 3, 4}) ASSERT_TRUE(Save(root.path(), s, 1, kJob, 1, kUidA).ok());
  // Neither a job id alone nor a uid alone may prune.
  ASSERT_TRUE(PruneCheckpoints(root.path(), CheckpointOwner(kJob), 1, -1).ok());
  ASSERT_TRUE(PruneCheckpoints(root.path(), CheckpointOwner("", kUidA), 1, -1).ok());
  EXPECT_EQ(Names(root.path()).size(), 5u);
  ASSERT_TRUE(PruneCheckpoints(root.path(), a, 1, -1).ok());
  EXPECT_EQ(Names(root.path()),
            (std::vector<std::string>{"step-00000001", "step-00000002", "step-00000004"}));
  EXPECT_TRUE(VerifyCheckpoint(root / "step-00000002", "").ok());
  EXPECT_EQ(VerifyCheckpoint(root / "step-00000002", "")->job_uid, "");
  // A writer without a uid replaces only a manifest without one of its job id, and commits
  // nowhere when the step's folder is another job's.
  ASSERT_TRUE(Save(root.path(), 2, 1, kJob, 2, "none").ok());
  EXPECT_EQ(VerifyCheckpoint(root / "step-00000002", "")->attempt, 2);
  absl::StatusOr<std::string> refused = Save(root.path(), 4, 1, kJob, 2, "none");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(Msg(refused.status()), HasSubstr("step-00000004"));
  EXPECT_EQ(VerifyCheckpoint(root / "step-00000004", "")->job_uid, kUidA);
  // A malformed uid in a manifest is DATA_LOSS.
  std::string bad = *ReadWholeFile(root / "step-00000004/manifest.json");
  bad.replace(bad.find(kUidA), 16, "../../etc/passwd");
  ASSERT_TRUE(WriteFileAtomically(root / "step-00000004/manifest.json", bad).ok());
  EXPECT_EQ(VerifyCheckpoint(root / "step-00000004", "").status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace latchkey
