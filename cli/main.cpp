// The stock `tapeformer` command: the library entry with the built-in kinds.
//
//   tapeformer train --config configs/shakespeare_char_cpu.json --data input.txt --out out/run
//   tapeformer train --out out/run --resume              # continue after an interruption
//   tapeformer sample --checkpoint out/run --prompt "ROMEO:" --tokens 300 --temperature 0.8
//   tapeformer eval --checkpoint out/run --data other.txt
//   tapeformer plot out/run out/other -o curves.png
//
// Errors print one line ("tapeformer: error: ...", by the name it was run as)
// and exit with status 1 (2 for command-line mistakes). Progress goes to
// stderr; `train` prints one JSON line with the final figures on stdout.
#include "tapeformer/cli/cli.h"

int main(int argc, char** argv) { return tapeformer::stock_cli_main(argc, argv); }
