// latchkey-worker: one rank of a latchkey job.
//
//   latchkey-worker --standalone --spec SPEC.json [--metrics-jsonl FILE] [--save DIR]
//       torchrun-style env: RANK, WORLD_SIZE (default 0 and 1), MASTER_ADDR (127.0.0.1),
//       MASTER_PORT (29500), LOCAL_WORLD_SIZE (ranks on this machine; default WORLD_SIZE).
//   latchkey-worker tokenize TEXT_FILE OUT.bin      byte-level (vocab 256) uint16 tokens
//
// Exit 0 on success; otherwise one line "latchkey-worker: <field>: <reason>" and exit 1
// (2 for a usage error).
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "worker/runner/standalone.h"
#include "worker/data/token_source.h"

namespace {

constexpr char kUsage[] =
    "usage: latchkey-worker --standalone --spec SPEC.json [--metrics-jsonl FILE] [--save DIR]\n"
    "                       [--metrics-port N [--metrics-host ADDR] [--linger-seconds S]]\n"
    "                       [--dump-grads DIR --dump-grads-step N]\n"
    "       latchkey-worker tokenize TEXT_FILE OUT.bin\n";

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
  latchkey::StandaloneOptions opts;
  bool standalone = false;
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
    } else if (a == "--spec") {
      if (!value(&opts.spec_path)) return UsageError("--spec needs a file");
    } else if (a == "--metrics-jsonl") {
      if (!value(&opts.metrics_jsonl)) return UsageError("--metrics-jsonl needs a file");
    } else if (a == "--save") {
      if (!value(&opts.save_dir)) return UsageError("--save needs a directory");
    } else if (a == "--dump-grads") {
      if (!value(&opts.engine.dump_grads_dir)) return UsageError("--dump-grads needs a directory");
    } else if (a == "--dump-grads-step") {
      if (!value(&v)) return UsageError("--dump-grads-step needs a number");
      opts.engine.dump_grads_step = std::atoll(v.c_str());
    } else if (a == "--test-skip-kv-reduce") {
      opts.engine.skip_kv_reduction_for_testing = true;
    } else if (a == "--metrics-port") {
      if (!value(&v)) return UsageError("--metrics-port needs a port (0 = any free one)");
      opts.metrics_port = std::atoi(v.c_str());
    } else if (a == "--metrics-host") {
      if (!value(&opts.metrics_host)) return UsageError("--metrics-host needs an address");
    } else if (a == "--linger-seconds") {
      if (!value(&v)) return UsageError("--linger-seconds needs a number");
      opts.linger_seconds = std::atof(v.c_str());
    } else if (a == "--quiet") {
      opts.quiet = true;
    } else {
      return UsageError("unknown argument '" + a + "'");
    }
  }
  if (!standalone) {
    return UsageError("only --standalone mode is available in this build");
  }
  if (opts.spec_path.empty()) return UsageError("--spec is required");
  absl::Status st = latchkey::RunStandalone(opts);
  if (!st.ok()) {
    std::cerr << "latchkey-worker: " << st.message() << "\n";
    return 1;
  }
  return 0;
}
