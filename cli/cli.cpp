// The `tapeformer` command as a library entry: cli/main.cpp is only
// `return tapeformer::stock_cli_main(argc, argv);`, and a program that
// registers kinds of its own calls cli_main, the same command (see
// cli/cli.h). The commands are the files of commands/; this file keeps their
// table and dispatches.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/cli/cli.h"
#include "tapeformer/commands/command.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/build_info.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/process_group.h"
#include "tapeformer/core/program_name.h"
#include "tapeformer/train/trainer.h"

namespace tapeformer {

// The commands, in --help's order: NAME is commands/NAME.cpp's `Command
// NAME_command()`. A new command is its file and its name here.
#define TAPEFORMER_COMMANDS(X) \
  X(train) X(sample) X(eval) X(calibrate) X(knn) X(rl) X(prepare) X(export) X(import_hf) X(plot) X(check) X(kinds)

#define TAPEFORMER_DECLARE_COMMAND(name) Command name##_command();
TAPEFORMER_COMMANDS(TAPEFORMER_DECLARE_COMMAND)
#undef TAPEFORMER_DECLARE_COMMAND

namespace {

std::vector<Command> command_table() {
#define TAPEFORMER_COMMAND_ENTRY(name) name##_command(),
  return {TAPEFORMER_COMMANDS(TAPEFORMER_COMMAND_ENTRY)};
#undef TAPEFORMER_COMMAND_ENTRY
}

// A kind that a config or checkpoint names but this program lacks. The stock
// command has the library's kinds only: one of the user's own was registered
// by a program built on cli_main, which is what to run. A program of the
// user's own is that program: it does not register this kind.
std::string with_registration_hint(const std::string& what, bool stock) {
  if (what.find(": unknown kind \"") == std::string::npos) return what;
  if (stock)
    return what + "; a kind of your own is known only to a program that registers it before calling "
                  "tapeformer::cli_main (docs/custom-layers.md): run that program instead of the stock command";
  const std::string& me = program_name();
  return what + "; " + me + " does not register this kind ('" + me +
         " kinds' lists the ones it has): a kind is known only to a program that registers it before calling "
         "tapeformer::cli_main (docs/custom-layers.md)";
}

// "tapeformer: error: " for the stock command, "my_lm: error: " for a program
// of the user's own run as my_lm: every line names the program that was run.
std::string error_prefix() { return program_name() + ": error: "; }

// This process's rank in an mpirun job, or -1 when it is the only process.
int job_rank() {
  try {
    const std::shared_ptr<ProcessGroup> g = ProcessGroup::world();
    return g ? g->rank() : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

// The error line (naming the rank in a distributed run); then the whole job
// ends, since the other ranks may be waiting for this one in a collective.
int fail_job(const std::string& what) {
  std::fflush(stdout);
  const int rank = job_rank();
  if (rank >= 0) {
    std::fprintf(stderr, "%srank %d: %s\n", error_prefix().c_str(), rank, what.c_str());
    std::fflush(stderr);
    ProcessGroup::abort_job(1);
  } else {
    std::fprintf(stderr, "%s%s\n", error_prefix().c_str(), what.c_str());
  }
  return 1;
}

// The program-wide flags and messages: --version, --threads, one-line errors.
void declare_program(CLI::App& app, CommandContext& ctx) {
  app.require_subcommand(1);
  // "tapeformer 0.1.0 (checkpoint format 3; ...)"; a program run under another
  // name says which library it is built on: "my_lm (tapeformer 0.1.0; ...)".
  const std::string build = std::string("checkpoint format ") + std::to_string(kCheckpointVersion) + "; " +
                            vector_description() + "; " +
                            (kernels::bf16_unsupported().empty() ? "bf16 products on AVX512-BF16"
                                                                 : "bf16 products: not on this CPU");
  const std::string release = std::string("tapeformer ") + TAPEFORMER_VERSION;
  app.set_version_flag("--version", program_name() == "tapeformer"
                                        ? release + " (" + build + ")"
                                        : program_name() + " (" + release + "; " + build + ")");
  app.fallthrough();  // --threads works before or after the subcommand
  // Command-line mistakes get one line, like every other error.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return error_prefix() + e.what() + " (see --help)\n";
  });
  number_option(&app, "--threads", ctx.threads,
                "worker threads (default: train.threads, $TAPEFORMER_THREADS or all cores)", integer_up_to(1024));
}

// "unknown command 'x' (expected train, sample, ... or kinds)" for a first
// argument that names no command, else "".
std::string unknown_command(const CLI::App& app, const std::string& first) {
  if (first.empty() || first[0] == '-') return "";
  std::string names;
  const std::vector<const CLI::App*> all = app.get_subcommands([](const CLI::App*) { return true; });
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i]->get_name() == first) return "";
    names += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i]->get_name();
  }
  return "unknown command '" + first + "' (expected " + names + "; see --help)";
}

// Runs the parsed command; every error becomes one line and an exit status.
int run_guarded(const CommandRunner& run, const CommandContext& ctx, bool stock) {
  try {
    if (ctx.threads >= 0) parallel::set_num_threads(ctx.threads);
    return run(ctx);
  } catch (const Interrupted& stop) {  // a checkpoint of the last step was saved (every rank stops together)
    std::fflush(stdout);
    if (job_rank() <= 0) std::fprintf(stderr, "%s: %s\n", program_name().c_str(), stop.what());
    return 128 + stop.signal();
  } catch (const Diverged& diverged) {  // every rank sees the same loss and weights, and stops together
    std::fflush(stdout);
    if (job_rank() <= 0) std::fprintf(stderr, "%s%s\n", error_prefix().c_str(), diverged.what());
    return 3;
  } catch (const std::bad_alloc&) {  // a command with sizes to give says which (train, rl collect)
    return fail_job("out of memory");
  } catch (const std::exception& err) {
    return fail_job(with_registration_hint(err.what(), stock));
  }
}

// cli_main and stock_cli_main: `stock` is the stock command, whose hint for a
// kind it lacks sends the user to their own program.
int run_cli(int argc, char** argv, bool stock) {
  // A write past `ulimit -f` then fails with EFBIG, and the writer names the
  // file, instead of the process dying with no word (prepare, export, train).
  std::signal(SIGXFSZ, SIG_IGN);
  if (argc > 0 && argv[0] != nullptr) {  // messages name the command the user ran
    const std::string path = argv[0];
    set_program_name(path.substr(path.find_last_of('/') + 1));
  }
  // --help's title and usage name the program as run (its basename, not the path).
  CLI::App app{program_name() + ": train small Transformer language models on a CPU", program_name()};
  CommandContext ctx;
  declare_program(app, ctx);
  std::vector<std::pair<CLI::App*, CommandRunner>> commands;
  try {
    for (const Command& c : command_table()) {
      CLI::App* sub = app.add_subcommand(c.name, c.summary);
      commands.emplace_back(sub, c.declare(*sub));
    }
    check_number_options(app);
  } catch (const std::exception& err) {
    return fail_job(err.what());
  }
  if (const std::string unknown = unknown_command(app, argc > 1 ? argv[1] : ""); !unknown.empty()) {
    std::fprintf(stderr, "%s%s\n", error_prefix().c_str(), unknown.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    const int code = app.exit(err);  // prints help, or the one-line failure message
    return code == 0 ? 0 : 2;
  }
  for (const auto& [sub, run] : commands)
    if (*sub) return run_guarded(run, ctx, stock);
  return 0;
}

}  // namespace

int cli_main(int argc, char** argv) { return run_cli(argc, argv, false); }

int stock_cli_main(int argc, char** argv) { return run_cli(argc, argv, true); }

}  // namespace tapeformer
