#include "bench/coordinator/coordinator_process.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "common/subprocess.h"

namespace latchkey::bench {

void RaiseOpenFileLimit() {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return 0;
  // Fields after the ")" of comm: state is field 3; utime 14, stime 15.
  std::istringstream rest(line.substr(close + 2));
  std::vector<std::string> f;
  std::string x;
  while (rest >> x) f.push_back(x);
  if (f.size() < 13) return 0;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (std::stod(f[11]) + std::stod(f[12])) / ticks;
}

namespace {

int64_t StatusKiB(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::atoll(line.c_str() + key.size() + 1);
  }
  return 0;
}

}  // namespace

int64_t ProcessRssBytes(pid_t pid) { return StatusKiB(pid, "VmRSS") * 1024; }
int64_t ProcessPeakRssBytes(pid_t pid) { return StatusKiB(pid, "VmHWM") * 1024; }

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int64_t CheckpointedDatabaseBytes(const std::string& db) {
  namespace fs = std::filesystem;
  if (fs::exists(db + "-wal")) {
    sqlite3* conn = nullptr;
    if (sqlite3_open_v2(db.c_str(), &conn, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
      sqlite3_close(conn);
      return -1;
    }
    sqlite3_busy_timeout(conn, 10000);
    sqlite3_exec(conn, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
    sqlite3_close(conn);
  }
  std::error_code ec;
  int64_t bytes = static_cast<int64_t>(fs::file_size(db, ec));
  if (ec) return -1;
  const auto wal = fs::file_size(db + "-wal", ec);
  if (!ec) bytes += static_cast<int64_t>(wal);
  return bytes;
}

}  // namespace latchkey::bench
