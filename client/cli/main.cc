// latchkey: the command-line client of latchkey-coordinator.
//
//   latchkey [--coordinator HOST:PORT] [--timeout S] [--json] COMMAND ... (the global options
//   also after the command: `latchkey validate SPEC --json`)
//   submit SPEC.json [--watch] [--dry-run] | validate SPEC.json | list | status JOB | watch JOB |
//   cancel JOB | resume JOB | suspend JOB | update JOB --kv-reduce MODE | --gas N | latches (audit)
//   JOB | up [--spec SPEC.json] | logs JOB | checkpoints JOB | checkpoint ... | completion bash|zsh
//   | trace JOB [--steps A..B] [-o FILE]
//   latchkey --version
// Exit codes: kExitCodeHelp (cli.h); a bad command line is a usage error (2), a value an
// option refuses an invalid value (3).
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "common/cli_checks.h"
#include "common/timeouts.h"
#include "latchkey_version.h"

namespace {

// The global options that take a value (their value is not the command).
bool TakesValue(const std::string& arg) {
  for (const char* o : {"--coordinator", "--timeout", "--token", "--tls-ca", "--tls-cert",
                        "--tls-key", "--credentials-file"}) {
    if (arg == o) return true;
  }
  return false;
}

// The command word of the command line: the first argument that is neither a global option nor
// its value; "" when there is none.
std::string CommandWord(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") return i + 1 < argc ? argv[i + 1] : "";
    if (!a.empty() && a[0] == '-') {
      if (TakesValue(a)) ++i;
      continue;
    }
    return a;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace latchkey::cli;  // NOLINT: the CLI's own namespace
  CliContext ctx;
  if (const char* env = std::getenv("LATCHKEY_COORDINATOR"); env && *env) {
    ctx.coordinator = env;
    ctx.coordinator_given = true;
  }
  for (auto [name, out] : {std::pair{"LATCHKEY_TOKEN", &ctx.credentials.token},
                           std::pair{"LATCHKEY_TLS_CA", &ctx.credentials.tls_ca},
                           std::pair{"LATCHKEY_TLS_CERT", &ctx.credentials.tls_cert},
                           std::pair{"LATCHKEY_TLS_KEY", &ctx.credentials.tls_key}}) {
    if (const char* env = std::getenv(name); env && *env) *out = env;
  }
  CLI::App app{"latchkey: submit and follow latchkey training jobs", "latchkey"};
  app.footer(std::string(kExitCodeHelp) +
             "\nThe coordinator defaults to $LATCHKEY_COORDINATOR, else " +
             latchkey::kDefaultCoordinatorAddress + ".");
  app.require_subcommand(1);
  // The global options are taken after the command too (`latchkey validate SPEC --json`): an
  // option a command does not know falls through to these. Set before the commands are added,
  // which inherit it.
  app.fallthrough();
  app.set_version_flag("--version", LATCHKEY_VERSION_LINE("latchkey"),
                       "print the version, git commit, libtorch version and CUDA on/off, and exit");
  CLI::Option* coordinator =
      app.add_option("--coordinator", ctx.coordinator, "coordinator address HOST:PORT")
          ->check(latchkey::cli::HostPort())
          ->capture_default_str();
  app.add_option("--timeout", ctx.timeout_s, "deadline of each call, seconds")
      ->check(latchkey::cli::Positive())
      ->capture_default_str();
  app.add_option("--token", ctx.credentials.token,
                 "bearer token (default $LATCHKEY_TOKEN, else the credentials file's entry for "
                 "the coordinator)")
      ->each([](const std::string&) {
        std::cerr << "latchkey: warning: --token shows the token to anyone who can list "
                     "processes; use LATCHKEY_TOKEN or --credentials-file\n";
      });
  app.add_option("--tls-ca", ctx.credentials.tls_ca,
                 "PEM CA of the coordinator's certificate: use TLS (default $LATCHKEY_TLS_CA)");
  app.add_option("--tls-cert", ctx.credentials.tls_cert,
                 "PEM client certificate for mTLS (default $LATCHKEY_TLS_CERT)");
  app.add_option("--tls-key", ctx.credentials.tls_key,
                 "PEM key of --tls-cert (default $LATCHKEY_TLS_KEY)");
  app.add_option("--credentials-file", ctx.credentials_file,
                 "token and CA per coordinator, written by `latchkey up` (default "
                 "$XDG_CONFIG_HOME/latchkey/credentials, else ~/.config/latchkey/credentials); "
                 "given, it must exist (except for `up`, which creates it)");
  app.add_flag("--json", ctx.json, "machine-readable output (one JSON object per line)");

  int exit_code = kOk;
  AddSubmitCommand(app, ctx, &exit_code);
  AddValidateCommand(app, ctx, &exit_code);
  AddListCommand(app, ctx, &exit_code);
  AddStatusCommand(app, ctx, &exit_code);
  AddWatchCommand(app, ctx, &exit_code);
  AddCancelCommand(app, ctx, &exit_code);
  AddResumeCommand(app, ctx, &exit_code);
  AddSuspendCommand(app, ctx, &exit_code);
  AddUpdateCommand(app, ctx, &exit_code);
  AddLatchesCommand(app, ctx, &exit_code);
  AddUpCommand(app, ctx, &exit_code);
  AddNodeCommand(app, ctx, &exit_code);
  AddLogsCommand(app, ctx, &exit_code);
  AddCheckpointsCommand(app, ctx, &exit_code);
  AddTraceCommand(app, ctx, &exit_code);
  AddCheckpointCommand(app, ctx, &exit_code);
  AddCompletionCommand(app, &exit_code);

  // An explicit --credentials-file must exist (a typo would silently mean "no token"); `up`
  // creates the file it is given.
  app.parse_complete_callback([&app, &ctx, coordinator] {
    if (coordinator->count() > 0) ctx.coordinator_given = true;
    if (ctx.credentials_file.empty() || app.got_subcommand("up")) return;
    if (!std::filesystem::exists(ctx.credentials_file)) {
      throw CLI::FileError("--credentials-file: '" + ctx.credentials_file + "' does not exist");
    }
  });

  // An unknown command is named with the list, not as CLI11's "A subcommand is required".
  if (const std::string word = CommandWord(argc, argv); !word.empty()) {
    std::vector<std::string> names;
    bool known = false;
    const CLI::App& all = app;
    for (const CLI::App* sub : all.get_subcommands([](const CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
      if (sub->check_name(word)) known = true;
    }
    if (!known) {
      std::cerr << "latchkey: unknown command '" << word << "'; the commands are "
                << absl::StrJoin(names, ", ") << " (latchkey --help)\n";
      return kUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    if (rc == 0) return kOk;
    // A value an option's check refused (or that does not convert) is an invalid value, as the
    // commands' own refusals of values are; anything else about the command line is usage.
    if (dynamic_cast<const CLI::ValidationError*>(&e) != nullptr ||
        dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
      return kInvalid;
    }
    return kUsage;
  }
  return exit_code;
}
