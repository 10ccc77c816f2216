#include "tapeformer/core/program_name.h"

namespace tapeformer {
namespace {

std::string& storage() {
  static std::string name = "tapeformer";
  return name;
}

}  // namespace

const std::string& program_name() { return storage(); }

void set_program_name(const std::string& name) {
  if (!name.empty()) storage() = name;
}

}  // namespace tapeformer
