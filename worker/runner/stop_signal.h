// The worker's stop signals (docs/fault-tolerance.md "Preemption"). SIGTERM (a node drain, a
// preemption, a pod's deletion: Kubernetes then waits terminationGracePeriodSeconds before
// SIGKILL) and SIGINT no longer end the process at once: the signal's number is recorded for
// the worker session, whose heartbeat thread tells the coordinator the rank leaves (the whole
// attempt then saves its last decided window and stops) and ends the process with
// kExitPreempted once latchkey.preemption.grace_seconds have passed. A second SIGTERM or SIGINT
// ends it at once, as the default action would.
//
// Thread-safety: install once, from main, before any thread starts; the flag is read from any
// thread.
#ifndef LATCHKEY_WORKER_RUNNER_STOP_SIGNAL_H_
#define LATCHKEY_WORKER_RUNNER_STOP_SIGNAL_H_

#include <atomic>

namespace latchkey {

// Installs the handlers; returns the flag: 0 until a stop signal came, then its number.
const std::atomic<int>* InstallStopSignals();

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_STOP_SIGNAL_H_
