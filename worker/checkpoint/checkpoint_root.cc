// A checkpoint root shared by jobs (train_checkpoint.h): the folder names, whose checkpoint a
// folder holds, and what a job finds, resumes, replaces and prunes there. Every decision about
// ownership goes through CheckpointBelongsTo.
#include <algorithm>
#include <filesystem>
#include <system_error>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/job_uid.h"
#include "common/spec_limits.h"
#include "worker/checkpoint/files.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/checkpoint/train_checkpoint_internal.h"

namespace latchkey {
namespace {

constexpr absl::string_view kStepPrefix = "step-";
constexpr size_t kStepDigits = 8;

// The step of "step-NNNNNNNN" at the start of `name` (8 digits), or -1.
int64_t LeadingStep(absl::string_view name) {
  if (name.size() < kStepPrefix.size() + kStepDigits || !absl::StartsWith(name, kStepPrefix)) {
    return -1;
  }
  int64_t step = 0;
  for (size_t i = kStepPrefix.size(); i < kStepPrefix.size() + kStepDigits; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// A temporary folder's name taken apart: ".step-N.<uid>.aK.tmp" and ".step-N.<uid>.replaced.tmp"
// are the job's with that uid; ".step-N.aK.tmp" and ".step-N.replaced.tmp" (written before job
// uids, or by a writer without one) have none.
struct TempDirName {
  int64_t step = 0;
  std::string job_uid;
};
std::optional<TempDirName> ParseTempDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, ".") || !absl::ConsumeSuffix(&name, ".tmp")) return std::nullopt;
  const int64_t step = LeadingStep(name);
  if (step < 0) return std::nullopt;
  name.remove_prefix(kStepPrefix.size() + kStepDigits);
  if (!absl::ConsumePrefix(&name, ".")) return std::nullopt;
  const std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  if (parts.size() == 1) return TempDirName{step, ""};
  if (parts.size() == 2 && IsJobUid(parts[0])) return TempDirName{step, std::string(parts[0])};
  return std::nullopt;
}

struct RootEntries {
  // Committed folders: newest step first, step-N before step-N.<uid>.
  std::vector<std::pair<CheckpointDirName, std::string>> committed;
  std::vector<std::pair<TempDirName, std::string>> temps;
};

absl::StatusOr<RootEntries> ListRoot(const std::string& root) {
  RootEntries out;
  std::error_code ec;
  std::filesystem::directory_iterator it(root, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", root, ": ", ec.message()));
  for (const auto& entry : it) {
    std::error_code dir_ec;
    if (!entry.is_directory(dir_ec)) continue;
    const std::string name = entry.path().filename().string();
    if (std::optional<CheckpointDirName> c = ParseCheckpointDirName(name)) {
      out.committed.emplace_back(*std::move(c), JoinPath(root, name));
    } else if (std::optional<TempDirName> t = ParseTempDirName(name)) {
      out.temps.emplace_back(*std::move(t), JoinPath(root, name));
    }
  }
  std::sort(out.committed.begin(), out.committed.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(-a.first.step, a.first.job_uid) <
           std::make_tuple(-b.first.step, b.first.job_uid);
  });
  return out;
}

std::string OwnerText(const CheckpointOwner& owner) {
  return absl::StrCat("job ", owner.job_id.empty() ? "(any)" : owner.job_id,
                      owner.job_uid.empty() ? "" : absl::StrCat(" (uid ", owner.job_uid, ")"));
}

}  // namespace

bool CheckpointBelongsTo(const CheckpointManifest& m, const CheckpointOwner& owner) {
  return (owner.job_id.empty() || m.job_id == owner.job_id) &&
         (owner.job_uid.empty() || m.job_uid == owner.job_uid);
}

std::string CheckpointStepDirName(int64_t step) {
  return absl::StrFormat("step-%08d", static_cast<long long>(step));
}

std::string CheckpointStepDirName(int64_t step, const std::string& job_uid) {
  if (job_uid.empty()) return CheckpointStepDirName(step);
  return absl::StrCat(CheckpointStepDirName(step), ".", job_uid);
}

std::string CheckpointTempDirName(int64_t step, const std::string& job_uid, int64_t attempt) {
  return absl::StrFormat(".step-%08d%s.a%d.tmp", static_cast<long long>(step),
                         job_uid.empty() ? "" : "." + job_uid, static_cast<long long>(attempt));
}

std::string CheckpointAsideDirName(int64_t step, const std::string& job_uid) {
  return absl::StrFormat(".step-%08d%s.replaced.tmp", static_cast<long long>(step),
                         job_uid.empty() ? "" : "." + job_uid);
}

std::string CheckpointRankFileName(int rank) {
  return absl::StrFormat("rank-%05d.safetensors", rank);
}

std::optional<CheckpointDirName> ParseCheckpointDirName(const std::string& name) {
  const int64_t step = LeadingStep(name);
  if (step < 0) return std::nullopt;
  absl::string_view rest = absl::string_view(name).substr(kStepPrefix.size() + kStepDigits);
  if (rest.empty()) return CheckpointDirName{step, ""};
  if (absl::ConsumePrefix(&rest, ".") && IsJobUid(rest)) {
    return CheckpointDirName{step, std::string(rest)};
  }
  return std::nullopt;
}

absl::StatusOr<std::string> CommitDirName(const std::string& root,
                                          const CheckpointManifest& manifest) {
  const std::string plain = CheckpointStepDirName(manifest.step);
  absl::StatusOr<PathKind> kind = GetPathKind(JoinPath(root, plain));
  if (!kind.ok()) return kind.status();
  if (*kind == PathKind::kMissing) return plain;
  // step-N is taken: replaced only when it holds a checkpoint of this very job. A writer
  // without a uid (a version 1 conversion, a coordinator before job uids) can only recognise
  // its own by a manifest without one.
  absl::StatusOr<CheckpointManifest> there = ReadManifestOnly(JoinPath(root, plain), "", nullptr);
  if (there.ok()) {
    const bool same_job =
        manifest.job_uid.empty()
            ? there->job_uid.empty() && there->job_id == manifest.job_id
            : CheckpointBelongsTo(*there, CheckpointOwner(manifest.job_id, manifest.job_uid));
    if (same_job) return plain;
  }
  if (manifest.job_uid.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(JoinPath(root, plain), ": holds a checkpoint of another job (",
                     there.ok() ? absl::StrCat("job_id ", there->job_id) : "unreadable",
                     "); a checkpoint without a job_uid has no other folder to commit to"));
  }
  const std::string named = CheckpointStepDirName(manifest.step, manifest.job_uid);
  // Named after this job's uid: its own (an earlier attempt's), unless another job id took the
  // uid (only a copied manifest could), which is refused rather than replaced.
  absl::StatusOr<PathKind> named_kind = GetPathKind(JoinPath(root, named));
  if (!named_kind.ok()) return named_kind.status();
  if (*named_kind != PathKind::kMissing) {
    absl::StatusOr<CheckpointManifest> m = ReadManifestOnly(JoinPath(root, named), "", nullptr);
    if (m.ok() && m->job_id != manifest.job_id) {
      return absl::FailedPreconditionError(
          absl::StrCat(JoinPath(root, named), ": holds a checkpoint of job_id ", m->job_id,
                       " with this job's job_uid ", manifest.job_uid));
    }
  }
  return named;
}

absl::StatusOr<std::vector<FoundCheckpoint>> ListCheckpoints(const std::string& root,
                                                             const CheckpointOwner& owner) {
  if (absl::Status st = CheckPathUnderEnvRoots("latchkey.checkpoint.dir", root); !st.ok()) {
    return st;
  }
  absl::StatusOr<RootEntries> entries = ListRoot(root);
  if (!entries.ok()) return entries.status();
  std::vector<FoundCheckpoint> out;
  for (const auto& [name, dir] : entries->committed) {
    absl::StatusOr<CheckpointManifest> m = ReadCheckpointManifest(dir, "");
    if (!m.ok() || !CheckpointBelongsTo(*m, owner)) continue;  // partial, or another job's
    out.push_back(FoundCheckpoint{name.step, dir, *std::move(m)});
  }
  return out;
}

absl::StatusOr<std::optional<FoundCheckpoint>> NewestValidCheckpoint(const std::string& root,
                                                                     const CheckpointOwner& owner) {
  if (absl::Status st = CheckPathUnderEnvRoots("latchkey.checkpoint.dir", root); !st.ok()) {
    return st;
  }
  absl::StatusOr<RootEntries> entries = ListRoot(root);
  if (!entries.ok()) return entries.status();
  for (const auto& [name, dir] : entries->committed) {
    absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(dir, "");
    if (!m.ok()) continue;  // partial or damaged: never loaded
    if (!CheckpointBelongsTo(*m, owner)) continue;
    return std::optional<FoundCheckpoint>(FoundCheckpoint{name.step, dir, *std::move(m)});
  }
  return std::optional<FoundCheckpoint>();
}

absl::StatusOr<std::string> FindCheckpointDir(const std::string& root, int64_t step,
                                              const CheckpointOwner& owner,
                                              const std::string& manifest_sha256) {
  if (absl::Status st = CheckPathUnderEnvRoots("latchkey.checkpoint.dir", root); !st.ok()) {
    return st;
  }
  absl::StatusOr<RootEntries> entries = ListRoot(root);
  if (!entries.ok()) return entries.status();
  std::string owned;
  for (const auto& [name, dir] : entries->committed) {
    if (name.step != step) continue;
    std::string sha;
    absl::StatusOr<CheckpointManifest> m = ReadManifestOnly(dir, "", &sha);
    if (!m.ok()) continue;
    if (!manifest_sha256.empty() && sha == manifest_sha256) return dir;
    if (owned.empty() && CheckpointBelongsTo(*m, owner)) owned = dir;
  }
  // No manifest with that SHA-256: the job's own folder of the step, whose load then names the
  // SHA-256 that differs.
  if (!owned.empty()) return owned;
  return absl::NotFoundError(absl::StrCat(
      root, ": no checkpoint of step ", step, " of ", OwnerText(owner),
      manifest_sha256.empty() ? "" : absl::StrCat(" (manifest SHA-256 ", manifest_sha256, ")")));
}

absl::Status PruneCheckpoints(const std::string& root, const CheckpointOwner& owner, int keep,
                              int64_t protect_step) {
  // Without both, "this job's" cannot be told from another job's: nothing is removed.
  if (owner.job_id.empty() || owner.job_uid.empty()) return absl::OkStatus();
  absl::StatusOr<RootEntries> entries = ListRoot(root);
  if (!entries.ok()) return entries.status();
  bool removed = false;
  // The newest committed checkpoint of the job is always kept.
  const size_t kept = static_cast<size_t>(std::max(keep, 1));
  size_t owned = 0;
  for (const auto& [name, dir] : entries->committed) {
    absl::StatusOr<CheckpointManifest> m = ReadManifestOnly(dir, "", nullptr);
    if (!m.ok() || !CheckpointBelongsTo(*m, owner)) continue;  // unreadable, or not the job's
    if (++owned <= kept || name.step == protect_step) continue;
    if (absl::Status st = RemoveTree(dir); !st.ok()) return st;
    removed = true;
  }
  // No save of the job is in flight after its commit: its temporary folders are left by
  // earlier attempts. Another job's (another uid) may be in flight: never touched.
  for (const auto& [name, dir] : entries->temps) {
    if (name.job_uid != owner.job_uid) continue;
    if (absl::Status st = RemoveTree(dir); !st.ok()) return st;
    removed = true;
  }
  if (removed) return FsyncDirectory(root);
  return absl::OkStatus();
}

}  // namespace latchkey
