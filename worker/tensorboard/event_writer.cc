#include "worker/tensorboard/event_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tensorboard/event.pb.h"
#include "worker/tensorboard/tfrecord.h"

namespace latchkey::tensorboard {
namespace {

namespace fs = std::filesystem;
constexpr const char kField[] = "latchkey.tensorboard.dir";
constexpr const char kPrefix[] = "events.out.tfevents.";

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The largest <secs> of the event files in `dir` (-1 when there are none).
int64_t NewestSeconds(const std::string& dir) {
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    std::vector<std::string> parts = absl::StrSplit(name.substr(sizeof(kPrefix) - 1), '.');
    int64_t secs = 0;
    if (!parts.empty() && absl::SimpleAtoi(parts[0], &secs)) newest = std::max(newest, secs);
  }
  return newest;
}

}  // namespace

std::vector<std::pair<std::string, double>> StepScalars(const StepReport& r) {
  std::vector<std::pair<std::string, double>> v;
  v.emplace_back("loss", r.loss);
  if (r.eval_loss) v.emplace_back("eval_loss", *r.eval_loss);
  v.emplace_back("lr", r.lr);
  v.emplace_back("grad_norm", r.grad_norm);
  v.emplace_back("tokens_per_second", TokensPerSecond(r));
  v.emplace_back("step_seconds", r.step_seconds);
  v.emplace_back("kv_allreduce_calls", static_cast<double>(r.kv_allreduce_calls));
  v.emplace_back("collective_share", CollectiveShare(r));
  if (r.checkpoint_seconds) v.emplace_back("checkpoint_seconds", *r.checkpoint_seconds);
  v.emplace_back("peak_memory_bytes", static_cast<double>(r.peak_memory_bytes));
  return v;
}

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Open(const std::string& dir,
                                                                       int64_t first_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat(kField, ": cannot create '", dir, "': ", ec.message()));
  }
  char host[256] = "localhost";
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
  host[sizeof(host) - 1] = '\0';
  const int64_t secs = std::max(static_cast<int64_t>(Now()), NewestSeconds(dir) + 1);
  char name[512];
  std::snprintf(name, sizeof(name), "%s%010lld.%s.%d.0", kPrefix, static_cast<long long>(secs),
                host, static_cast<int>(getpid()));
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(kField, ": cannot create '", path, "': ", std::strerror(errno)));
  }
  std::unique_ptr<EventFileWriter> w(new EventFileWriter(fd, path));
  Event version;
  version.set_wall_time(Now());
  version.set_file_version("brain.Event:2");
  if (absl::Status st = w->WriteRecord(version.SerializeAsString()); !st.ok()) return st;
  Event start;
  start.set_wall_time(Now());
  start.set_step(first_step);
  start.mutable_session_log()->set_status(SessionLog::START);
  if (absl::Status st = w->WriteRecord(start.SerializeAsString()); !st.ok()) return st;
  return w;
}

EventFileWriter::~EventFileWriter() { ::close(fd_); }

absl::Status EventFileWriter::WriteScalars(
    int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  Event e;
  e.set_wall_time(Now());
  e.set_step(step);
  for (const auto& [tag, value] : values) {
    SummaryValue* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return WriteRecord(e.SerializeAsString());
}

absl::Status EventFileWriter::WriteRecord(const std::string& event_bytes) {
  const std::string record = FrameRecord(event_bytes);
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(
          absl::StrCat(kField, ": writing '", path_, "': ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace latchkey::tensorboard
