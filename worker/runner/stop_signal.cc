#include "worker/runner/stop_signal.h"

#include <csignal>

namespace latchkey {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler stores into it");

void OnStopSignal(int sig) {
  if (g_stop_signal.load() != 0) {  // the second one: the default action, now
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal.store(sig);
}

}  // namespace

const std::atomic<int>* InstallStopSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return &g_stop_signal;
}

}  // namespace latchkey
