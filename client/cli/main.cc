// latchkey: the command-line client of latchkey-coordinator.
//
//   latchkey [--coordinator HOST:PORT] [--timeout S] [--json] COMMAND ...
//   submit SPEC.json [--watch] | list | status JOB | watch JOB | cancel JOB |
//   update JOB --kv-reduce MODE | --gas N | latches (audit) JOB | up [--spec SPEC.json]
#include <cstdlib>
#include <iostream>
#include <utility>

#include "client/cli/cli.h"
#include "common/cli_checks.h"
#include "common/timeouts.h"

int main(int argc, char** argv) {
  using namespace latchkey::cli;  // NOLINT: the CLI's own namespace
  CliContext ctx;
  if (const char* env = std::getenv("LATCHKEY_COORDINATOR"); env && *env) ctx.coordinator = env;
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
  app.add_option("--coordinator", ctx.coordinator, "coordinator address HOST:PORT")
      ->check(latchkey::cli::HostPort())
      ->capture_default_str();
  app.add_option("--timeout", ctx.timeout_s, "deadline of each call, seconds")
      ->check(latchkey::cli::Positive())
      ->capture_default_str();
  app.add_option("--token", ctx.credentials.token,
                 "bearer token (default $LATCHKEY_TOKEN, else the credentials file's entry for "
                 "the coordinator)");
  app.add_option("--tls-ca", ctx.credentials.tls_ca,
                 "PEM CA of the coordinator's certificate: use TLS (default $LATCHKEY_TLS_CA)");
  app.add_option("--tls-cert", ctx.credentials.tls_cert,
                 "PEM client certificate for mTLS (default $LATCHKEY_TLS_CERT)");
  app.add_option("--tls-key", ctx.credentials.tls_key,
                 "PEM key of --tls-cert (default $LATCHKEY_TLS_KEY)");
  app.add_option("--credentials-file", ctx.credentials_file,
                 "token and CA per coordinator, written by `latchkey up` (default "
                 "$XDG_CONFIG_HOME/latchkey/credentials, else ~/.config/latchkey/credentials)");
  app.add_flag("--json", ctx.json, "machine-readable output (one JSON object per line)");

  int exit_code = kOk;
  AddSubmitCommand(app, ctx, &exit_code);
  AddListCommand(app, ctx, &exit_code);
  AddStatusCommand(app, ctx, &exit_code);
  AddWatchCommand(app, ctx, &exit_code);
  AddCancelCommand(app, ctx, &exit_code);
  AddUpdateCommand(app, ctx, &exit_code);
  AddLatchesCommand(app, ctx, &exit_code);
  AddUpCommand(app, ctx, &exit_code);
  AddCheckpointCommand(app, ctx, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kOk : kUsage;
  }
  return exit_code;
}
