#include "worker/runner/worker_flags.h"

#include <cstdlib>
#include <functional>
#include <iostream>

#include "common/host_port.h"

namespace latchkey {

const char kWorkerUsage[] =
    "usage: latchkey-worker --coordinator HOST:PORT --job JOB_ID [--join-token-file F] "
    "[options]\n"
    "       (join token: $LATCHKEY_JOIN_TOKEN or --join-token-file; TLS: --tls-ca F,\n"
    "        mTLS: --tls-cert F --tls-key F, or $LATCHKEY_TLS_CA/CERT/KEY)\n"
    "       latchkey-worker --standalone --spec SPEC.json [--resume | --resume-from DIR] "
    "[options]\n"
    "       latchkey-worker tokenize TEXT_FILE OUT.bin\n"
    "       latchkey-worker --version\n"
    "options: --metrics-jsonl FILE  --save DIR  --port-file FILE  --quiet\n"
    "         --log-steps (every rank logs its per-step line)\n"
    "         --trace-jsonl FILE (the rank's spans, written as its run ends; {rank} replaced)\n"
    "         --trace-spans N (the span ring's size; default 65536, 0 = no trace)\n"
    "         --metrics-port N (0 = any free port)  --metrics-host ADDR  --linger-seconds S\n"
    "         --collective-timeout-seconds S (default 120)  --advertise-host ADDR\n"
    "         --join-timeout S (wait this long for the coordinator to answer the join;\n"
    "           default 120)\n"
    "         --dump-grads DIR --dump-grads-step N  --dump-samples FILE N\n"
    "exit: 0 done, 1 error, 2 usage, 3 the training diverged (a non-finite loss or grad norm;\n"
    "      not restarted), 75 stuck in a fenced attempt (restart me)\n";

namespace {

// One flag: its name, and either a switch (`set_switch`) or a value (`set_value`, with the
// message for a missing value). A value's setter refuses a bad value with its own message.
using SetSwitch = std::function<void(WorkerFlags&)>;
using SetValue = std::function<absl::Status(WorkerFlags&, const std::string&)>;
struct Flag {
  const char* name;
  SetSwitch set_switch;
  const char* missing_value;
  SetValue set_value;
};

Flag Switch(const char* name, SetSwitch set) {
  return Flag{name, std::move(set), nullptr, nullptr};
}
Flag Value(const char* name, const char* missing, SetValue set) {
  return Flag{name, nullptr, missing, std::move(set)};
}

// A setter that stores the text as given.
SetValue Store(std::string WorkerFlags::*field) {
  return [field](WorkerFlags& f, const std::string& v) {
    f.*field = v;
    return absl::OkStatus();
  };
}

SetValue StoreIn(std::function<std::string*(WorkerFlags&)> field) {
  return [field](WorkerFlags& f, const std::string& v) {
    *field(f) = v;
    return absl::OkStatus();
  };
}

const std::vector<Flag>& FlagTable() {
  static const std::vector<Flag> table = {
      Switch("--standalone", [](WorkerFlags& f) { f.standalone = true; }),
      Switch("--resume", [](WorkerFlags& f) { f.resume = true; }),
      Value("--resume-from", "--resume-from needs a checkpoint folder (step-N)",
            Store(&WorkerFlags::resume_from)),
      Value("--spec", "--spec needs a file", Store(&WorkerFlags::spec_path)),
      Value("--coordinator", "--coordinator needs HOST:PORT", Store(&WorkerFlags::coordinator)),
      Value("--job", "--job needs a job id", Store(&WorkerFlags::job)),
      Value(
          "--join-token", "--join-token needs a token",
          [](WorkerFlags& f, const std::string& v) {
            f.token = v;
            std::cerr << "latchkey-worker: warning: --join-token shows the token to anyone who can "
                         "list processes; use LATCHKEY_JOIN_TOKEN or --join-token-file\n";
            return absl::OkStatus();
          }),
      Value("--join-token-file", "--join-token-file needs a file", Store(&WorkerFlags::token_file)),
      Value("--tls-ca", "--tls-ca needs a PEM file", Store(&WorkerFlags::tls_ca)),
      Value("--tls-cert", "--tls-cert needs a PEM file", Store(&WorkerFlags::tls_cert)),
      Value("--tls-key", "--tls-key needs a PEM file", Store(&WorkerFlags::tls_key)),
      Value("--advertise-host", "--advertise-host needs an address",
            Store(&WorkerFlags::advertise)),
      Value("--metrics-jsonl", "--metrics-jsonl needs a file",
            StoreIn([](WorkerFlags& f) { return &f.run.outputs.metrics_jsonl; })),
      Value("--trace-jsonl", "--trace-jsonl needs a file",
            StoreIn([](WorkerFlags& f) { return &f.run.outputs.trace_jsonl; })),
      Value("--trace-spans", "--trace-spans needs a count in [0, 16777216]",
            [](WorkerFlags& f, const std::string& v) {
              absl::StatusOr<long long> n = ParseInteger(v);
              if (!n.ok() || *n < 0 || *n > (1 << 24)) {
                return absl::InvalidArgumentError("--trace-spans needs a count in [0, 16777216]");
              }
              f.run.outputs.trace_spans = *n;
              return absl::OkStatus();
            }),
      Value("--save", "--save needs a directory",
            StoreIn([](WorkerFlags& f) { return &f.run.save_dir; })),
      Value("--metrics-port", "--metrics-port needs a port (0 = any free one)",
            [](WorkerFlags& f, const std::string& v) {
              absl::StatusOr<int> port = ParsePort(v, -1);
              if (!port.ok()) {
                return absl::InvalidArgumentError("--metrics-port: " +
                                                  std::string(port.status().message()));
              }
              f.run.outputs.metrics_port = *port;
              return absl::OkStatus();
            }),
      Value("--port-file", "--port-file needs a file",
            StoreIn([](WorkerFlags& f) { return &f.run.outputs.port_file; })),
      Value("--metrics-host", "--metrics-host needs an address",
            StoreIn([](WorkerFlags& f) { return &f.run.outputs.metrics_host; })),
      Value("--linger-seconds", "--linger-seconds needs a number >= 0",
            [](WorkerFlags& f, const std::string& v) {
              absl::StatusOr<double> s = ParseNumber(v);
              if (!s.ok() || *s < 0) {
                return absl::InvalidArgumentError("--linger-seconds needs a number >= 0");
              }
              f.run.outputs.linger_seconds = *s;
              return absl::OkStatus();
            }),
      Value("--collective-timeout-seconds",
            "--collective-timeout-seconds needs whole seconds in [1, 86400]",
            [](WorkerFlags& f, const std::string& v) {
              absl::StatusOr<long long> s = ParseInteger(v);
              if (!s.ok() || *s <= 0 || *s > 86400) {
                return absl::InvalidArgumentError(
                    "--collective-timeout-seconds needs whole seconds in [1, 86400]");
              }
              f.collective_timeout = std::chrono::seconds(*s);
              return absl::OkStatus();
            }),
      Value("--join-timeout", "--join-timeout needs seconds > 0",
            [](WorkerFlags& f, const std::string& v) {
              absl::StatusOr<double> s = ParseNumber(v);
              if (!s.ok() || !(*s > 0) || *s > 86400 * 365) {
                return absl::InvalidArgumentError("--join-timeout needs seconds > 0, got '" + v +
                                                  "'");
              }
              f.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(*s * 1000));
              return absl::OkStatus();
            }),
      Value("--dump-grads", "--dump-grads needs a directory",
            StoreIn([](WorkerFlags& f) { return &f.run.engine.dump_grads_dir; })),
      Value("--dump-grads-step", "--dump-grads-step needs a step number >= 0",
            [](WorkerFlags& f, const std::string& v) {
              absl::StatusOr<long long> s = ParseInteger(v);
              if (!s.ok() || *s < 0) {
                return absl::InvalidArgumentError("--dump-grads-step needs a step number >= 0");
              }
              f.run.engine.dump_grads_step = *s;
              return absl::OkStatus();
            }),
      // Test-only faults. The window number is taken as atoll reads it (no refusal).
      Value("--test-throw-at-window", "--test-throw-at-window needs a number",
            [](WorkerFlags& f, const std::string& v) {
              f.run.throw_at_window_for_testing = std::atoll(v.c_str());
              return absl::OkStatus();
            }),
      Value("--test-min-window-seconds", "--test-min-window-seconds needs a number",
            [](WorkerFlags& f, const std::string& v) {
              f.run.min_window_seconds = std::atof(v.c_str());
              return absl::OkStatus();
            }),
      Value("--test-perturb-replica-rank", "--test-perturb-replica-rank needs a rank >= 0",
            [](WorkerFlags& f, const std::string& v) {
              absl::StatusOr<long long> r = ParseInteger(v);
              if (!r.ok() || *r < 0 || *r > (1 << 30)) {
                return absl::InvalidArgumentError(
                    "--test-perturb-replica-rank needs a rank >= 0, got '" + v + "'");
              }
              f.run.perturb_replica_rank_for_testing = static_cast<int>(*r);
              return absl::OkStatus();
            }),
      Switch("--test-skip-kv-reduce",
             [](WorkerFlags& f) { f.run.engine.skip_kv_reduction_for_testing = true; }),
      Switch("--quiet", [](WorkerFlags& f) { f.run.outputs.quiet = true; }),
      Switch("--log-steps", [](WorkerFlags& f) { f.run.outputs.log_steps = true; }),
  };
  return table;
}

}  // namespace

absl::StatusOr<WorkerFlags> ParseWorkerFlags(const std::vector<std::string>& args,
                                             const WorkerEnv& env) {
  WorkerFlags flags;
  flags.coordinator = env.coordinator;
  flags.job = env.job_id;
  flags.token = env.join_token;
  flags.tls_ca = env.tls_ca;
  flags.tls_cert = env.tls_cert;
  flags.tls_key = env.tls_key;
  flags.run.min_window_seconds = env.test_min_window_seconds;
  const std::vector<Flag>& table = FlagTable();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--dump-samples") {  // two values: FILE N (worker/data/sample_dump.h)
      absl::StatusOr<long long> n =
          i + 2 < args.size() ? ParseInteger(args[i + 2]) : absl::InvalidArgumentError("");
      if (!n.ok() || *n < 1) {
        return absl::InvalidArgumentError(
            "--dump-samples needs a file and a number of micro-batches >= 1");
      }
      flags.run.engine.dump_samples_file = args[i + 1];
      flags.run.engine.dump_samples_micro_batches = *n;
      i += 2;
      continue;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : table) {
      if (a == f.name) flag = &f;
    }
    if (flag == nullptr) return absl::InvalidArgumentError("unknown argument '" + a + "'");
    if (flag->set_switch) {
      flag->set_switch(flags);
      continue;
    }
    if (i + 1 >= args.size()) return absl::InvalidArgumentError(flag->missing_value);
    if (absl::Status st = flag->set_value(flags, args[++i]); !st.ok()) return st;
  }
  return flags;
}

absl::Status ValidateWorkerFlags(const WorkerFlags& flags) {
  if (flags.standalone) {
    if (flags.spec_path.empty()) {
      return absl::InvalidArgumentError("--spec is required with --standalone");
    }
    if (flags.resume && !flags.resume_from.empty()) {
      return absl::InvalidArgumentError(
          "--resume-from names the checkpoint to resume from: drop --resume");
    }
    return absl::OkStatus();
  }
  if (flags.resume || !flags.resume_from.empty()) {
    return absl::InvalidArgumentError(std::string(flags.resume ? "--resume" : "--resume-from") +
                                      " is for --standalone (the coordinator says where to "
                                      "resume)");
  }
#ifdef LATCHKEY_WITH_COORDINATOR
  if (flags.job.empty())
    return absl::InvalidArgumentError("--job (or LATCHKEY_JOB_ID) is required");
  return absl::OkStatus();
#else
  return absl::InvalidArgumentError(
      "this build has only --standalone mode (built with LATCHKEY_CORE_ONLY)");
#endif
}

}  // namespace latchkey
