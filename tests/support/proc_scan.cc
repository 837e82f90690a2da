#include "tests/support/proc_scan.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace latchkey::testing {

std::string ReadProcFile(int pid, const std::string& name) {
  const std::string path = "/proc/" + std::to_string(pid) + "/" + name;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else {
      text.clear();  // ESRCH: it exited mid-read; anything else: treat as unreadable
      break;
    }
  }
  close(fd);
  return text;
}

namespace {
// The state letter and parent pid from /proc/PID/stat ("pid (comm) S ppid ..."); state 0 when
// the process is gone.
struct StatLine {
  char state = 0;
  int ppid = -1;
};
StatLine ReadStat(int pid) {
  StatLine s;
  const std::string text = ReadProcFile(pid, "stat");
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return s;
  s.state = text[paren + 2];
  std::sscanf(text.c_str() + paren + 2, "%*c %d", &s.ppid);
  return s;
}
}  // namespace

bool ProcessAlive(int pid) {
  const char state = ReadStat(pid).state;
  return state != 0 && state != 'Z';
}

std::set<int> LiveProcesses(const std::string& needle, int parent) {
  std::set<int> found;
  DIR* d = opendir("/proc");
  if (d == nullptr) return found;
  while (dirent* e = readdir(d)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    std::string args = ReadProcFile(pid, "cmdline");
    std::replace(args.begin(), args.end(), '\0', ' ');
    const StatLine stat = ReadStat(pid);
    if (stat.state == 0 || stat.state == 'Z') continue;
    const bool named = !needle.empty() && args.find(needle) != std::string::npos;
    if (named || (parent > 0 && stat.ppid == parent)) found.insert(pid);
  }
  closedir(d);
  return found;
}

std::map<std::string, std::set<int>> ShmSegmentPids() {
  std::map<std::string, std::set<int>> out;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "latchkey-shm-", 13) != 0) continue;
    std::ifstream in(std::string("/dev/shm/") + e->d_name, std::ios::binary);
    char header[16] = {0};
    if (!in.read(header, sizeof(header))) continue;
    uint32_t ranks = 0;
    std::memcpy(&ranks, header + 12, 4);
    std::set<int>& pids = out[e->d_name];
    for (uint32_t r = 0; r < std::min<uint32_t>(ranks, 4096); ++r) {
      int32_t pid = 0;
      in.seekg(4096 + 64 * static_cast<std::streamoff>(r) + 12);
      if (!in.read(reinterpret_cast<char*>(&pid), 4)) break;
      if (pid > 0) pids.insert(pid);
    }
  }
  closedir(d);
  return out;
}

}  // namespace latchkey::testing
