// `latchkey completion bash|zsh`: a completion script for the commands and options registered
// on the app, so it never lists a command that does not exist nor misses one that does.
//   bash:  source <(latchkey completion bash)
//   zsh:   source <(latchkey completion zsh)      (autoload -U compinit && compinit first)
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "client/cli/cli.h"

namespace latchkey::cli {
namespace {

std::vector<std::string> OptionWords(const CLI::App& app) {
  std::vector<std::string> words;
  for (const CLI::Option* o :
       app.get_options([](const CLI::Option* o) { return o->nonpositional(); })) {
    for (const std::string& l : o->get_lnames()) words.push_back("--" + l);
    for (const std::string& s : o->get_snames()) words.push_back("-" + s);
  }
  return words;
}

std::vector<const CLI::App*> Subcommands(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App* s) { return !s->get_name().empty(); });
}

// command path ("", "checkpoint", ...) -> words completing after it.
std::map<std::string, std::vector<std::string>> Table(const CLI::App& root) {
  std::map<std::string, std::vector<std::string>> table;
  std::vector<std::string>& top = table[""];
  for (const CLI::App* sub : Subcommands(root)) {
    std::vector<std::string> words;
    for (const CLI::App* inner : Subcommands(*sub)) {
      words.push_back(inner->get_name());
      table[sub->get_name() + " " + inner->get_name()] = OptionWords(*inner);
    }
    for (const std::string& w : OptionWords(*sub)) words.push_back(w);
    // A command's aliases (`audit` for `latches`) complete as the command does.
    std::vector<std::string> names = {sub->get_name()};
    for (const std::string& alias : sub->get_aliases()) names.push_back(alias);
    for (const std::string& name : names) {
      top.push_back(name);
      table[name] = words;
    }
  }
  for (const std::string& w : OptionWords(root)) top.push_back(w);
  return table;
}

std::string BashScript(const CLI::App& root) {
  const auto table = Table(root);
  std::string cases;
  std::vector<std::string> paths;
  for (const auto& [path, words] : table) {
    cases += "    \"" + path + "\") words=\"" + absl::StrJoin(words, " ") + "\" ;;\n";
    if (!path.empty()) paths.push_back("\"" + path + "\"");
  }
  // The command path is the words that name commands (options and their values skipped); the
  // candidates are what follows that path.
  return "# bash completion for latchkey (latchkey completion bash)\n"
         "_latchkey() {\n"
         "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" path=\"\" w i\n"
         "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
         "    w=\"${COMP_WORDS[i]}\"\n"
         "    [[ \"$w\" == -* ]] && continue\n"
         "    case \"${path:+$path }$w\" in\n"
         "      " +
         absl::StrJoin(paths, "|") +
         ") path=\"${path:+$path }$w\" ;;\n"
         "    esac\n"
         "  done\n"
         "  local words=\"\"\n"
         "  case \"$path\" in\n" +
         cases +
         "  esac\n"
         "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
         "  [[ ${#COMPREPLY[@]} -eq 0 ]] && COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "  return 0\n"
         "}\n"
         "complete -o filenames -F _latchkey latchkey\n";
}

std::string ZshScript(const CLI::App& root) {
  // zsh runs bash completion functions through bashcompinit: one script, two shells.
  return "#compdef latchkey\n# zsh completion for latchkey (latchkey completion zsh)\n"
         "autoload -U +X bashcompinit && bashcompinit\n" +
         BashScript(root);
}

}  // namespace

void AddCompletionCommand(CLI::App& app, int* exit_code) {
  auto shell = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "completion", "Print a shell completion script: source <(latchkey completion bash)");
  sub->add_option("shell", *shell, "bash | zsh")->required()->check(CLI::IsMember({"bash", "zsh"}));
  const CLI::App* root = &app;
  sub->callback([shell, root, exit_code] {
    std::cout << (*shell == "bash" ? BashScript(*root) : ZshScript(*root));
    *exit_code = kOk;
  });
}

}  // namespace latchkey::cli
