// Logits of a checkpoint's model (optionally with safetensors weights) for
// given token ids, as one JSON line: what bench/safetensors_vs_pytorch.py
// compares against PyTorch running the exported file.
//
//   build/bench/export_logits --checkpoint out/run [--weights model.safetensors] --ids 1,2,3
//   -> {"shape": [1, 3, V], "logits": [...]}
#include <CLI/CLI.hpp>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/load_model.h"

using namespace tapeformer;

namespace {

int run(int argc, char** argv) {
  CLI::App app{"logits of a checkpoint's model for token ids, as JSON"};
  std::string checkpoint, weights, ids_text;
  app.add_option("--checkpoint", checkpoint, "run directory")->required();
  app.add_option("--weights", weights, "safetensors file replacing the checkpoint's weights");
  app.add_option("--ids", ids_text, "comma-separated token ids")->required();
  check_number_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  Loaded l = load_model(checkpoint, weights);
  LanguageModel& model = *l.model;
  Rng rng(0);
  std::vector<int32_t> ids;
  for (const int64_t id : bench::parse_list(ids_text, "--ids")) {
    // The model reads int32 ids: a larger one would wrap into another token.
    TAPEFORMER_CHECK(id >= 0 && id <= std::numeric_limits<int32_t>::max(),
                     "--ids: a token id must be in [0, 2147483647], got ", id);
    ids.push_back(static_cast<int32_t>(id));
  }
  NoGradGuard no_grad;
  const Tensor logits = model.forward(IndexTensor({1, static_cast<int64_t>(ids.size())}, ids), rng).value();
  std::string out = "{\"shape\": [1, " + std::to_string(ids.size()) + ", " + std::to_string(logits.dim(2)) +
                    "], \"logits\": [";
  const std::vector<Scalar> v = logits.to_vector();
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.9g", i ? ", " : "", static_cast<double>(v[i]));
    out += buf;
  }
  std::printf("%s]}\n", out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("export_logits", run, argc, argv); }
