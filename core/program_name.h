// The command a user runs this program as ("tapeformer"; cli_main sets it
// from argv[0]), so that a program that registers kinds of its own is named
// in the messages that tell the user what to run next.
#pragma once

#include <string>

namespace tapeformer {

const std::string& program_name();
void set_program_name(const std::string& name);  // an empty name is ignored

}  // namespace tapeformer
