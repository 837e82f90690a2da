// The run folder of `latchkey up` (up.h): its lock, and each job's records in RUN/jobs/JOB with
// the top level's links to the newest job's.
//
// Why links rather than copies: the newest job's files at the top level are the ones its
// workers are writing, so whatever reads RUN/steps-0.jsonl or follows RUN/worker-0.log while
// the job runs sees every line as it is written, and nothing is written twice. The links are
// relative (jobs/JOB/NAME), so a run folder moved or copied elsewhere keeps them.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/cli/up.h"

namespace latchkey::cli {
namespace {

namespace fs = std::filesystem;

// worker-R.log or steps-R.jsonl: a rank's record at the top level of a run folder.
bool IsRankRecord(const std::string& name) {
  for (const auto& [prefix, suffix] : {std::pair<std::string, std::string>{"worker-", ".log"},
                                       std::pair<std::string, std::string>{"steps-", ".jsonl"}}) {
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string rank =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    bool digits = true;
    for (char c : rank) digits = digits && absl::ascii_isdigit(static_cast<unsigned char>(c));
    if (digits) return true;
  }
  return false;
}

// Whether the folder holds records of the older layout: plain files at the top level.
bool HasTopLevelFiles(const std::string& run_dir) {
  for (const char* name : {"/worker-0.log", "/steps-0.jsonl"}) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(run_dir + name, ec);
    if (!ec && fs::is_regular_file(st)) return true;
  }
  return false;
}

// The newest job the registry records in `run_dir`.
std::optional<RunRecord> NewestRecordIn(const std::string& run_dir) {
  for (const RunRecord& r : ReadRuns()) {
    if (r.run_dir == run_dir) return r;
  }
  return std::nullopt;
}

std::string Now() { return std::to_string(static_cast<long long>(std::time(nullptr))); }

}  // namespace

absl::StatusOr<int> AcquireRunLock(const std::string& run_dir) {
  const std::string path = run_dir + "/up.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("--run-dir: cannot open ", path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const std::string holder = ReadTextFile(path);
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("--run-dir ", run_dir, ": another latchkey up is running in it (pid ",
                     holder.empty() ? std::string("?") : holder.substr(0, holder.find('\n')),
                     "); give another --run-dir, or wait for it to end"));
  }
  if (ftruncate(fd, 0) == 0) {
    const std::string pid = std::to_string(getpid()) + "\n";
    (void)!write(fd, pid.data(), pid.size());
  }
  return fd;
}

bool RunIsLive(const std::string& run_dir) {
  const int fd = open((run_dir + "/up.lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);
  return held;
}

std::string AbsoluteFolder(const std::string& path) {
  std::string folder = fs::absolute(path).lexically_normal().string();
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  return folder;
}

std::string JobRecordsDir(const std::string& run_dir, const std::string& job_id) {
  return run_dir + "/jobs/" + job_id;
}

void SetAsidePreviousRecords(const std::string& run_dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    if (!IsRankRecord(e.path().filename().string())) continue;
    std::error_code sec;
    if (e.is_symlink(sec)) {
      fs::remove(e.path(), sec);  // the link only: the job's files stay in RUN/jobs/
    } else if (e.is_regular_file(sec)) {
      files.push_back(e.path());
    }
  }
  if (files.empty()) return;
  // The older layout: the last job's records at the top level, with its spec.
  std::string dest = run_dir + "/jobs/earlier-" + Now();
  if (std::optional<RunRecord> newest = NewestRecordIn(run_dir);
      newest && !fs::exists(JobRecordsDir(run_dir, newest->job_id))) {
    dest = JobRecordsDir(run_dir, newest->job_id);
  }
  fs::create_directories(dest, ec);
  if (ec) return;  // StartJobRecords replaces them; it reports a folder it cannot write
  for (const fs::path& f : files) fs::rename(f, dest / f.filename(), ec);
  fs::copy_file(run_dir + "/spec.json", dest + "/spec.json", ec);
}

absl::Status StartJobRecords(const std::string& run_dir, const std::string& job_id, int world) {
  const std::string dir = JobRecordsDir(run_dir, job_id);
  std::error_code ec;
  // The same id in the same folder: a database removed since numbered its jobs again.
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec)) {
    fs::rename(dir, dir + ".earlier-" + Now(), ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot move ", dir, " aside for the new ", job_id, ": ", ec.message()));
    }
  }
  fs::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  fs::copy_file(run_dir + "/spec.json", dir + "/spec.json", fs::copy_options::overwrite_existing,
                ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot copy ", run_dir, "/spec.json into ", dir, ": ", ec.message()));
  }
  for (int r = 0; r < world; ++r) {
    for (const std::string& name :
         {absl::StrCat("worker-", r, ".log"), absl::StrCat("steps-", r, ".jsonl")}) {
      // A new link renamed over the old one: the name never goes missing.
      const std::string link = run_dir + "/" + name;
      const std::string tmp = run_dir + "/." + name + ".link";
      fs::remove(tmp, ec);
      fs::create_symlink("jobs/" + job_id + "/" + name, tmp, ec);
      if (!ec) fs::rename(tmp, link, ec);
      if (ec) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot point ", link, " at ", dir, ": ", ec.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FindJobRecords(const RunRecord& run) {
  const std::string dir = JobRecordsDir(run.run_dir, run.job_id);
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return dir;
  // A folder of the older layout holds its newest job's records at the top level.
  std::optional<RunRecord> newest;
  if (HasTopLevelFiles(run.run_dir)) {
    newest = NewestRecordIn(run.run_dir);
    if (!newest || newest->job_id == run.job_id) return run.run_dir;
  }
  return absl::NotFoundError(
      absl::StrCat("job ", run.job_id, ": no records of it in ", dir,
                   newest ? absl::StrCat(" (the files at the top of ", run.run_dir, " are job ",
                                         newest->job_id, "'s)")
                          : std::string(),
                   "; latchkey up keeps each job's records in RUN/jobs/JOB"));
}

}  // namespace latchkey::cli
