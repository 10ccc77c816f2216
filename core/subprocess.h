// Running another program without a shell: its arguments go to it as they
// are, so no file name, title or other user text is ever read as shell code.
//
//   ProgramResult r = run_program({"gnuplot"}, script);   // script on stdin, PATH searched
//   if (r.status != 0) fail("gnuplot: ", r.err);
//   write_file_atomic(output, r.out);                     // what it printed on stdout
//
// The program's stdin gets `input` and is then closed; its stdout and stderr
// are collected (each at most `max_output` bytes) while the input is
// written, so neither side waits on a full pipe. It starts with the default
// signal mask and SIGPIPE at its default; this process ignores the SIGPIPE
// of a program that exits before reading all of its input.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tapeformer {

struct ProgramResult {
  int status = 0;   // the exit status, or 128 + the signal that ended it
  std::string out;  // what it wrote on stdout
  std::string err;  // what it wrote on stderr
};

// Error "cannot run NAME: not installed (no NAME on PATH)" when argv[0] is
// not found, naming the reason for any other failure to start it, and when
// its stdout or stderr exceeds max_output bytes.
ProgramResult run_program(const std::vector<std::string>& argv, const std::string& input,
                          size_t max_output = size_t{256} << 20);

}  // namespace tapeformer
