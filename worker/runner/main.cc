// latchkey-worker: one rank of a latchkey job.
//
//   latchkey-worker --coordinator HOST:PORT --job JOB_ID [--join-token-file F] [outputs...]
//       joins a job at the coordinator (flags or LATCHKEY_COORDINATOR, LATCHKEY_JOB_ID; the
//       join token from LATCHKEY_JOIN_TOKEN or --join-token-file: --join-token TOKEN works but
//       shows the token to `ps` and warns; RANK (else JOB_COMPLETION_INDEX, a Kubernetes
//       Indexed Job's pod), when set, asks for that rank). TLS to the
//       coordinator: --tls-ca F (LATCHKEY_TLS_CA), mTLS also --tls-cert F --tls-key F
//       (LATCHKEY_TLS_CERT, LATCHKEY_TLS_KEY).
//   latchkey-worker --standalone --spec SPEC.json [outputs...]
//       torchrun-style env: RANK, WORLD_SIZE (default 0 and 1), MASTER_ADDR (127.0.0.1),
//       MASTER_PORT (29500), LOCAL_WORLD_SIZE (ranks on this machine; default WORLD_SIZE).
//       --resume continues after the newest valid checkpoint in the spec's
//       latchkey.checkpoint.dir (step 0 when there is none); every rank must be given it.
//   latchkey-worker tokenize TEXT_FILE OUT.bin      byte-level (vocab 256) uint16 tokens
//
// Exit 0 on success; otherwise one line "latchkey-worker: <field>: <reason>" and exit 1
// (2 for a usage error).
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/host_port.h"
#include "common/job_spec.h"
#include "common/timeouts.h"
#include "worker/data/token_source.h"
#include "worker/runner/env.h"
#include "worker/runner/standalone.h"
#ifdef LATCHKEY_WITH_COORDINATOR
#include "worker/runner/coordinated.h"
#endif

namespace {

constexpr char kUsage[] =
    "usage: latchkey-worker --coordinator HOST:PORT --job JOB_ID [--join-token-file F] "
    "[options]\n"
    "       (join token: $LATCHKEY_JOIN_TOKEN or --join-token-file; TLS: --tls-ca F,\n"
    "        mTLS: --tls-cert F --tls-key F, or $LATCHKEY_TLS_CA/CERT/KEY)\n"
    "       latchkey-worker --standalone --spec SPEC.json [--resume] [options]\n"
    "       latchkey-worker tokenize TEXT_FILE OUT.bin\n"
    "options: --metrics-jsonl FILE  --save DIR  --port-file FILE  --quiet\n"
    "         --metrics-port N (0 = any free port)  --metrics-host ADDR  --linger-seconds S\n"
    "         --collective-timeout-seconds S (default 120)  --advertise-host ADDR\n"
    "         --dump-grads DIR --dump-grads-step N\n";

int UsageError(const std::string& msg) {
  std::cerr << "latchkey-worker: " << msg << "\n" << kUsage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "tokenize") {
    if (args.size() != 3) return UsageError("tokenize takes TEXT_FILE OUT.bin");
    auto n = latchkey::TokenizeBytesFile(args[1], args[2]);
    if (!n.ok()) {
      std::cerr << "latchkey-worker: " << n.status().message() << "\n";
      return 1;
    }
    std::cout << "wrote " << *n << " tokens (uint16, vocab 256) to " << args[2] << "\n";
    return 0;
  }
  auto env = latchkey::ReadWorkerEnv();
  if (!env.ok()) {
    std::cerr << "latchkey-worker: " << env.status().message() << "\n";
    return 1;
  }
  bool standalone = false, resume = false;
  std::string spec_path, coordinator = env->coordinator, job = env->job_id, token = env->join_token,
                         advertise, token_file;
  std::string tls_ca = env->tls_ca, tls_cert = env->tls_cert, tls_key = env->tls_key;
  std::chrono::milliseconds collective_timeout{latchkey::kDefaultCollectiveTimeout};
  latchkey::RunOptions run;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* out) -> bool {
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    std::string v;
    if (a == "--standalone") {
      standalone = true;
    } else if (a == "--resume") {
      resume = true;
    } else if (a == "--spec") {
      if (!value(&spec_path)) return UsageError("--spec needs a file");
    } else if (a == "--coordinator") {
      if (!value(&coordinator)) return UsageError("--coordinator needs HOST:PORT");
    } else if (a == "--job") {
      if (!value(&job)) return UsageError("--job needs a job id");
    } else if (a == "--join-token") {
      if (!value(&token)) return UsageError("--join-token needs a token");
      std::cerr << "latchkey-worker: warning: --join-token shows the token to anyone who can "
                   "list processes; use LATCHKEY_JOIN_TOKEN or --join-token-file\n";
    } else if (a == "--join-token-file") {
      if (!value(&token_file)) return UsageError("--join-token-file needs a file");
    } else if (a == "--tls-ca") {
      if (!value(&tls_ca)) return UsageError("--tls-ca needs a PEM file");
    } else if (a == "--tls-cert") {
      if (!value(&tls_cert)) return UsageError("--tls-cert needs a PEM file");
    } else if (a == "--tls-key") {
      if (!value(&tls_key)) return UsageError("--tls-key needs a PEM file");
    } else if (a == "--advertise-host") {
      if (!value(&advertise)) return UsageError("--advertise-host needs an address");
    } else if (a == "--metrics-jsonl") {
      if (!value(&run.outputs.metrics_jsonl)) return UsageError("--metrics-jsonl needs a file");
    } else if (a == "--save") {
      if (!value(&run.save_dir)) return UsageError("--save needs a directory");
    } else if (a == "--metrics-port") {
      if (!value(&v)) return UsageError("--metrics-port needs a port (0 = any free one)");
      absl::StatusOr<int> port = latchkey::ParsePort(v, -1);
      if (!port.ok()) return UsageError("--metrics-port: " + std::string(port.status().message()));
      run.outputs.metrics_port = *port;
    } else if (a == "--port-file") {
      if (!value(&run.outputs.port_file)) return UsageError("--port-file needs a file");
    } else if (a == "--metrics-host") {
      if (!value(&run.outputs.metrics_host)) return UsageError("--metrics-host needs an address");
    } else if (a == "--linger-seconds") {
      absl::StatusOr<double> s = value(&v) ? latchkey::ParseNumber(v) : absl::StatusOr<double>(-1);
      if (!s.ok() || *s < 0) return UsageError("--linger-seconds needs a number >= 0");
      run.outputs.linger_seconds = *s;
    } else if (a == "--collective-timeout-seconds") {
      absl::StatusOr<long long> s =
          value(&v) ? latchkey::ParseInteger(v) : absl::StatusOr<long long>(0);
      if (!s.ok() || *s <= 0 || *s > 86400) {
        return UsageError("--collective-timeout-seconds needs whole seconds in [1, 86400]");
      }
      collective_timeout = std::chrono::seconds(*s);
    } else if (a == "--dump-grads") {
      if (!value(&run.engine.dump_grads_dir)) return UsageError("--dump-grads needs a directory");
    } else if (a == "--dump-grads-step") {
      absl::StatusOr<long long> s =
          value(&v) ? latchkey::ParseInteger(v) : absl::StatusOr<long long>(-1);
      if (!s.ok() || *s < 0) return UsageError("--dump-grads-step needs a step number >= 0");
      run.engine.dump_grads_step = *s;
    } else if (a == "--test-throw-at-window") {
      if (!value(&v)) return UsageError("--test-throw-at-window needs a number");
      run.throw_at_window_for_testing = std::atoll(v.c_str());
    } else if (a == "--test-skip-kv-reduce") {
      run.engine.skip_kv_reduction_for_testing = true;
    } else if (a == "--quiet") {
      run.outputs.quiet = true;
    } else {
      return UsageError("unknown argument '" + a + "'");
    }
  }
  absl::Status st;
  if (standalone) {
    if (spec_path.empty()) return UsageError("--spec is required with --standalone");
    if (resume) {
      // A spec that does not load is reported by the run itself, naming its field.
      auto spec = latchkey::LoadJobSpecFile(spec_path);
      if (spec.ok() && !spec->checkpoint.enabled()) {
        return UsageError("--resume needs latchkey.checkpoint (latchkey.checkpoint.dir) in " +
                          spec_path);
      }
    }
    latchkey::StandaloneOptions opts;
    opts.spec_path = spec_path;
    opts.run = run;
    opts.collective_timeout = collective_timeout;
    opts.resume = resume;
    st = latchkey::RunStandalone(opts, *env);
  } else {
    if (resume)
      return UsageError("--resume is for --standalone (the coordinator says where to resume)");
#ifdef LATCHKEY_WITH_COORDINATOR
    if (job.empty()) return UsageError("--job (or LATCHKEY_JOB_ID) is required");
    latchkey::CoordinatedOptions opts;
    if (!coordinator.empty()) opts.coordinator = coordinator;
    opts.job_id = job;
    if (!token_file.empty()) {
      auto from_file = latchkey::ReadJoinTokenFile(token_file);
      if (!from_file.ok()) return UsageError(std::string(from_file.status().message()));
      token = *from_file;
    }
    opts.join_token = token;
    opts.credentials.tls_ca = tls_ca;
    opts.credentials.tls_cert = tls_cert;
    opts.credentials.tls_key = tls_key;
    opts.advertise_host = advertise;
    if (env->rank) opts.requested_rank = *env->rank;
    opts.run = run;
    opts.collective_timeout = collective_timeout;
    st = latchkey::RunCoordinated(opts, *env);
#else
    return UsageError("this build has only --standalone mode (built with LATCHKEY_CORE_ONLY)");
#endif
  }
  if (!st.ok()) {
    std::cerr << "latchkey-worker: " << st.message() << "\n";
    return 1;
  }
  return 0;
}
