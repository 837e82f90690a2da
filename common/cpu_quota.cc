#include "common/cpu_quota.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>

namespace latchkey {

std::optional<int> CoresOfCpuMax(const std::string& text) {
  std::istringstream in(text);
  std::string quota;
  int64_t period = 0;
  if (!(in >> quota >> period) || period <= 0 || quota == "max") return std::nullopt;
  int64_t q = 0;
  try {
    size_t used = 0;
    q = std::stoll(quota, &used);
    if (used != quota.size() || q <= 0) return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
  return static_cast<int>(std::max<int64_t>(1, (q + period - 1) / period));
}

std::optional<int> CgroupCpuQuotaCores(const std::string& proc_self_cgroup,
                                       const std::string& cgroup_root) {
  std::ifstream groups(proc_self_cgroup);
  std::string path;
  for (std::string line; std::getline(groups, line);) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty() || path[0] != '/') return std::nullopt;  // cgroup v1, or unreadable
  std::optional<int> tightest;
  while (true) {
    std::ifstream max(cgroup_root + (path == "/" ? "" : path) + "/cpu.max");
    std::stringstream text;
    text << max.rdbuf();
    if (const std::optional<int> cores = CoresOfCpuMax(text.str())) {
      tightest = tightest ? std::min(*tightest, *cores) : *cores;
    }
    if (path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return tightest;
}

}  // namespace latchkey
