// `tapeformer eval`: a checkpoint's loss, bits per character and perplexity
// on a text file (train/eval_file.h), as one JSON line.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/commands/command.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/commands/knn_flags.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/metrics.h"

namespace tapeformer {
namespace {

// Per-layer figures as a JSON object {"name": [values], ...}.
std::string layers_json(const std::vector<std::pair<std::string, std::vector<double>>>& layers) {
  std::string out = "{";
  for (const auto& [name, values] : layers) {
    out += (out.size() > 1 ? ", \"" : "\"") + name + "\": [";
    for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + json_number(values[i]);
    out += "]";
  }
  return out + "}";
}

// Prints {"loss", "bpc", "perplexity", "tokens"} as one JSON line on stdout;
// with --knn also "lm_loss", "lm_bpc" (the model alone) and "knn" {"keys",
// "k", "lambda", "temperature"}. The reading's progress goes to stderr
// (train/metrics.h: quick work stays quiet).
int run_eval(const EvalArgs& args) {
  ProgressScope progress("eval");
  const EvalResult r = evaluate_file(args);
  // A finite loss can still overflow the perplexity: JSON gets null for it.
  std::printf("{\"loss\": %.6f, \"bpc\": %.6f, \"perplexity\": %s, \"tokens\": %lld", r.loss, r.bpc(),
              json_fixed(r.perplexity(), 4).c_str(), static_cast<long long>(r.tokens));
  if (args.knn.on())
    std::printf(", \"lm_loss\": %.6f, \"lm_bpc\": %.6f, \"knn\": {\"keys\": %lld, \"k\": %lld, \"lambda\": %s, "
                "\"temperature\": %s}",
                r.lm_loss, r.lm_loss / std::log(2.0) * r.tokens_per_char, static_cast<long long>(r.knn_keys),
                static_cast<long long>(args.knn.k), json_number(args.knn.lambda).c_str(),
                json_number(args.knn.temperature).c_str());
  if (args.report_layers) std::printf(", \"layers\": %s", layers_json(r.layers).c_str());
  std::printf("}\n");
  if (args.report_layers && r.layers.empty()) std::fprintf(stderr, "eval: %s\n", kNoLayerFigures);
  return 0;
}

}  // namespace

Command eval_command() {
  return {"eval", "loss, bits per char and perplexity of a checkpoint on a text file", [](CLI::App& e) -> CommandRunner {
            auto args = std::make_shared<EvalArgs>();
            e.add_option("--checkpoint", args->checkpoint, "run directory (or checkpoint.bin)")->required();
            e.add_option("--data", args->data, "text file to evaluate on")->required();
            e.add_option("--weights", args->weights, "safetensors file replacing the checkpoint's weights");
            number_option(&e, "--context", args->context,
                          "window length in tokens (0 = block size; past block size needs a scheme without a table)",
                          integer_up_to(kMaxCount))
                ->capture_default_str();
            e.add_option("--split", args->split,
                         "all | train | val: the part of the file (the run's data.val_fraction)")
                ->check(CLI::IsMember({"all", "train", "val"}))
                ->capture_default_str();
            add_knn_flags(&e, args->knn);
            e.add_flag("--report-layers", args->report_layers,
                        "add the figures the model's layers log to the JSON line (\"layers\": an early-exit model's mean layers used)");
            return [args](const CommandContext&) { return run_eval(*args); };
          }};
}

}  // namespace tapeformer
