// `tapeformer check`: the conformance checks of train/check.h on named kinds
// (or on every kind of the checked families).
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/commands/command.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/layers/memory/memory.h"
#include "tapeformer/layers/mlp.h"
#include "tapeformer/layers/positional/positional.h"
#include "tapeformer/train/check.h"

namespace tapeformer {
namespace {

// `check`: the conformance checks of train/check.h on the named kinds (or on
// every kind of the checked families); a line per check on stdout, and exit
// status 1 when any failed.
int run_check(const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, std::string>> kinds;
  for (const std::string& n : names) {
    const size_t eq = n.find('=');
    TAPEFORMER_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < n.size(), "check: --kind takes FAMILY=NAME (e.g. "
                     "model.attention=softmax), got '", n, "'");
    kinds.emplace_back(n.substr(0, eq), n.substr(eq + 1));
  }
  if (kinds.empty()) {
    const auto all = [&](const std::string& family, const auto& registry) {
      for (const auto& k : registry.kinds()) kinds.emplace_back(family, k.name);
    };
    all("model.attention", attention_kinds());
    all("model.positional", positional_kinds());
    all("model.block", block_kinds());
    all("model.mlp", mlp_kinds());
    all("memory", memory_kinds());
    all("model.arch", model_kinds());
  }
  int failed = 0;
  for (const auto& [family, name] : kinds) {
    const KindCheck r = check_kind(family, name);
    std::fputs(r.text().c_str(), stdout);
    std::fflush(stdout);
    failed += r.ok() ? 0 : 1;
  }
  std::printf("check: %zu kinds, %d failed\n", kinds.size(), failed);
  return failed > 0 ? 1 : 0;
}

}  // namespace

Command check_command() {
  return {"check", "run the conformance checks on registered kinds: parameters, causality, generation, resume, gradient",
          [](CLI::App& ck) -> CommandRunner {
            auto names = std::make_shared<std::vector<std::string>>();
            ck.add_option("--kind", *names,
                          "FAMILY=NAME, e.g. model.attention=softcap (repeatable; default: every kind of "
                          "model.attention, model.positional, model.block, model.mlp, memory and model.arch)");
            return [names](const CommandContext&) { return run_check(*names); };
          }};
}

}  // namespace tapeformer
