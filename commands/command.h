// A subcommand of the `tapeformer` program. Each lives in its own file of
// commands/ (NAME.cpp defines `Command NAME_command()`), declares its own
// flags and runs the engine (train/, layers/) with them; cli_main keeps a
// table of them and only dispatches. No command includes another.
//
//   Command eval_command() {
//     return {"eval", "loss, bits per char and perplexity of a checkpoint on a text file", [](CLI::App& app) {
//               auto args = std::make_shared<EvalArgs>();   // bound to the flags, owned by the runner
//               app.add_option("--checkpoint", args->checkpoint, "run directory")->required();
//               return [args](const CommandContext&) { return run_eval(*args); };
//             }};
//   }
//
// A new command is its file plus its name in cli/cli.cpp's table.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace tapeformer {

// What every command may read besides its own flags: the program-wide ones.
struct CommandContext {
  int threads = -1;  // --threads (-1: not given)
};

// Runs a command whose flags were parsed; returns the exit status. Errors
// are exceptions (tapeformer::Error: one line, status 1), as everywhere.
using CommandRunner = std::function<int(const CommandContext&)>;

struct Command {
  std::string name;     // the subcommand: `tapeformer NAME`
  std::string summary;  // its line in --help
  // Declares the command's flags (and sub-subcommands) on its CLI11
  // subcommand, and returns what runs it once they are parsed.
  std::function<CommandRunner(CLI::App& app)> declare;
};

}  // namespace tapeformer
