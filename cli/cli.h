// The `tapeformer` command (train, sample, eval, prepare, export, plot) as a
// function, so that a program with kinds of its own gets every subcommand:
//
//   #include <tapeformer/cli/cli.h>
//   int main(int argc, char** argv) {
//     tapeformer::attention_kinds().add(sigmoid_attention_kind());  // before any config is read
//     return tapeformer::cli_main(argc, argv);
//   }
//
//   ./my_tapeformer train --config my.json --set model.attention=sigmoid ...
//   ./my_tapeformer sample --checkpoint out/run      // the checkpoint names the kind again
//
// Usage, output and exit statuses are the stock command's (docs/cli.md):
// 0 on success, 1 for an error (one "my_tapeformer: error: ..." line on
// stderr), 2 for a command-line mistake, 128 + N after signal N stopped
// training with a checkpoint saved. Every message, --help and --version name
// the program by the name it was run as (argv[0]'s last component), and a
// kind that a config or checkpoint names but the program does not register is
// refused with the program's name and how a kind gets registered.
#pragma once

namespace tapeformer {

int cli_main(int argc, char** argv);

// The stock `tapeformer` command itself (cli/main.cpp): cli_main, except that
// a kind it does not know is taken for one of a user's own program (built on
// cli_main), and the error says to run that program. Not for a user's program.
int stock_cli_main(int argc, char** argv);

}  // namespace tapeformer
