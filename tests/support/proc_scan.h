// What a test sees of other processes through /proc and /dev/shm: whether a pid is alive, which
// live processes name a string on their command line (or have a given parent), and which pids
// the shared-memory segments' control blocks name. Every read tolerates a process that exits
// while it is read (the kernel then fails the read with ESRCH): that process counts as gone.
#ifndef LATCHKEY_TESTS_SUPPORT_PROC_SCAN_H_
#define LATCHKEY_TESTS_SUPPORT_PROC_SCAN_H_

#include <map>
#include <set>
#include <string>

namespace latchkey::testing {

// The contents of /proc/PID/NAME, or "" when the process (or the file) is gone.
std::string ReadProcFile(int pid, const std::string& name);
// True while `pid` exists and is not a zombie waiting to be reaped.
bool ProcessAlive(int pid);
// Every live process (not this one) whose command line contains `needle`, plus, when `parent`
// is positive, every live child of `parent`.
std::set<int> LiveProcesses(const std::string& needle, int parent = -1);
// For each latchkey shm segment in /dev/shm, the pids in its ranks' control blocks
// (docs/transport.md: the header's rank count at byte 12, rank r's block at 4096 + 64 r with its
// pid at byte 12).
std::map<std::string, std::set<int>> ShmSegmentPids();

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_PROC_SCAN_H_
