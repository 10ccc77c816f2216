// `tapeformer sample`: text (or images, --png) generated from a checkpoint.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/commands/command.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/commands/image.h"
#include "tapeformer/commands/knn_flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/layers/models/early_exit.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/knn.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/run_directory.h"
#include "tapeformer/train/sample.h"

namespace tapeformer {
namespace {
namespace fs = std::filesystem;

struct SampleArgs {
  std::string checkpoint;  // run directory or checkpoint file
  std::string weights;     // a safetensors file replacing the checkpoint's weights (optional)
  std::string prompt = "\n";  // "-": read from stdin
  std::string prompt_file;    // when set, the prompt is this file's text
  SampleOptions options;
  KnnOptions knn;             // a kNN-LM store mixed into each token's distribution (train/knn.h)
  // Images (commands/image.h): `images` samples of options.tokens pixel letters
  // each from the prompt, drawn `image_width` pixels wide into the PNG `png`.
  std::string png;
  int64_t image_width = 0;
  int64_t images = 16;
  bool report_layers = false;  // after sampling, the figures layers log (an early-exit model's mean layers used) and the speed, on stderr
  bool full_depth = false;     // every layer for every position (early exit, ACT): the same text, no time saved
  double exit_threshold = std::nan("");  // an early-exit model's threshold instead of the calibrated one (NaN: not given)
};

// A prompt longer than the command line allows (128 KiB) comes from a file or stdin.
constexpr size_t kMaxPromptBytes = size_t{64} << 20;

// The text of a prompt file (or of stdin for "-"): refused when not a
// regular file, unreadable, larger than kMaxPromptBytes or holding a NUL byte.
std::string read_prompt(std::istream& in, const std::string& origin) {
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    const auto got = static_cast<size_t>(in.gcount());
    const auto* nul = static_cast<const char*>(std::memchr(chunk, '\0', got));
    if (nul != nullptr)
      fail(origin, " looks binary (NUL byte at offset ", text.size() + static_cast<size_t>(nul - chunk), "), not text");
    TAPEFORMER_CHECK(text.size() + got <= kMaxPromptBytes, origin, " is larger than ", kMaxPromptBytes >> 20,
                     " MiB, more than a prompt");
    text.append(chunk, got);
  }
  TAPEFORMER_CHECK(!in.bad(), origin, ": cannot read");
  return text;
}

std::string prompt_text(const SampleArgs& args) {
  if (!args.prompt_file.empty()) {
    const std::string origin = "--prompt-file '" + args.prompt_file + "'";
    check_regular_file(args.prompt_file, "--prompt-file");
    TAPEFORMER_CHECK(!fs::is_directory(args.prompt_file), origin, " is a directory, not a text file");
    std::ifstream in(args.prompt_file, std::ios::binary);
    TAPEFORMER_CHECK(in.good(), origin, ": cannot open (", std::strerror(errno), ")");
    return read_prompt(in, origin);
  }
  if (args.prompt == "-") return read_prompt(std::cin, "--prompt - (stdin)");
  return args.prompt;
}

// The figures layers log, one line each on stderr ("sample: exit_layers_mean 2.31"),
// then the speed of generation: `tokens` new tokens in `seconds`, from the
// prompt's read to the last token, printing included (the checkpoint's load
// excluded).
void report_layers(const LanguageModel& model, int64_t tokens, double seconds) {
  const auto layers = model.layer_metrics();
  if (layers.empty()) std::fprintf(stderr, "sample: %s\n", kNoLayerFigures);
  for (const auto& [name, values] : layers) {
    std::string line = "sample: " + name;
    for (double v : values) line += " " + json_number(v);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  if (tokens == 0 || seconds <= 0) return;
  std::fprintf(stderr, "sample: tokens_per_s %s\nsample: ms_per_token %s\n",
               json_number(static_cast<double>(tokens) / seconds).c_str(),
               json_number(1e3 * seconds / static_cast<double>(tokens)).c_str());
}

// The model-changing flags: an early-exit model's threshold, full depth.
void adapt_model(const SampleArgs& args, const Loaded& l) {
  TAPEFORMER_CHECK(!args.full_depth || l.model->set_full_depth(true), "sample --full-depth: model.arch \"",
                   l.cfg.model.arch, "\" with model.block \"", l.cfg.model.block,
                   "\" stops no position early (early exit, ACT halting): every layer runs for every token already");
  if (std::isnan(args.exit_threshold)) return;
  auto* exits = dynamic_cast<EarlyExitLM*>(l.model.get());
  TAPEFORMER_CHECK(exits != nullptr, "sample --exit-threshold: the checkpoint's model is model.arch \"", l.cfg.model.arch,
                   "\", not \"early_exit\"");
  exits->set_threshold(args.exit_threshold);
}

// Prints the prompt followed by the generated text on stdout. A prompt file
// or stdin must be text (no NUL byte, at most 64 MiB); NaN or inf logits are
// an Error naming the file the weights came from, before the prompt is printed.
int run_sample(const SampleArgs& args) {
  args.options.validate();  // before anything reaches stdout
  const std::string prompt_str = prompt_text(args);
  Loaded l = load_model(args.checkpoint, args.weights);
  adapt_model(args, l);
  std::vector<int32_t> prompt;
  try {
    prompt = l.tokenizer->encode(prompt_str);
  } catch (const Error& e) {
    fail(args.prompt_file.empty() ? "prompt" : "--prompt-file '" + args.prompt_file + "'", ": ", e.what());
  }
  const int64_t context = sample_context(*l.model, args.options);  // refused before anything reaches stdout
  // The model kind's hooks (the extra inputs of every token fed), and kNN-LM's mixture.
  std::unique_ptr<ModelHooks> hooks = reading_hooks(l, context, args.knn, "sample");
  const std::unique_ptr<KnnMixture> mixture = knn_mixture(args.knn, l.cfg, *l.model, *l.tokenizer);  // or null
  Rng rng(args.options.seed);
  // The prompt is printed with the first token, so that weights giving NaN
  // logits (refused at the first token) leave stdout empty.
  bool prompt_printed = false;
  const auto print_prompt = [&] {
    if (!prompt_printed) std::fwrite(prompt_str.data(), 1, prompt_str.size(), stdout);
    prompt_printed = true;
  };
  if (!args.png.empty()) {  // images: each sampled from the prompt, one per line, then the grid
    // Before any image: the grid never goes over an input or a run's file.
    RunDirectory::check_output("sample --png", args.png,
                               {checkpoint_file(args.checkpoint), args.weights, args.prompt_file, args.knn.store});
    TAPEFORMER_CHECK(args.image_width >= 1 && args.options.tokens % args.image_width == 0 && args.images >= 1,
                     "sample --png: --tokens (", args.options.tokens, ", the pixels of an image) must be a multiple "
                     "of --image-width (", args.image_width, "), and --images (", args.images, ") >= 1");
    char top = 0;  // the checkpoint's highest letter: full ink
    for (int32_t id = 0; id < static_cast<int32_t>(l.tokenizer->vocab_size()); ++id) {
      const std::string c = l.tokenizer->decode({id});
      if (c.size() == 1 && c[0] >= 'a' && c[0] <= 'z') top = std::max(top, c[0]);
    }
    TAPEFORMER_CHECK(top > 'a', "sample --png: the checkpoint's vocabulary has no pixel letters a, b, ... (a model "
                     "trained on images as scripts/digits.py writes them)");
    std::vector<std::string> records;
    for (int64_t k = 0; k < args.images; ++k) {
      std::vector<int32_t> ids;
      try {
        ids = generate(*l.model, prompt, args.options, rng, {}, {hooks.get(), mixture.get()});
      } catch (const NonFiniteLogits& e) {
        fail("sample: ", e.logit, ": the weights in '", weights_file(args.checkpoint, args.weights), "' are not usable");
      }
      std::string record;  // a character per token: one that is not a single character shows as '?'
      for (auto id = ids.begin() + static_cast<int64_t>(prompt.size()); id != ids.end(); ++id) {
        const std::string c = l.tokenizer->decode({*id});
        record += c.size() == 1 ? c[0] : '?';
      }
      records.push_back(record);
      std::string line = records.back();  // one line per image: a sampled newline shows as '?'
      std::replace(line.begin(), line.end(), '\n', '?');
      std::printf("%s\n", line.c_str());
    }
    const int64_t outside = write_image_grid(args.png, records, args.image_width, top);
    std::fprintf(stderr, "sample: %lld images written to %s%s\n", static_cast<long long>(args.images), args.png.c_str(),
                 outside > 0 ? (" (" + std::to_string(outside) + " sampled tokens were no pixel letter: drawn blank)").c_str() : "");
    if (args.report_layers) report_layers(*l.model, 0, 0);
    return 0;
  }
  StreamDecoder text(*l.tokenizer);  // a byte token waits for the rest of its character
  const auto started = std::chrono::steady_clock::now();
  try {
    generate(*l.model, prompt, args.options, rng, [&](int32_t id) {
      print_prompt();
      std::fputs(text.push(id).c_str(), stdout);
      std::fflush(stdout);
    }, {hooks.get(), mixture.get()});
  } catch (const NonFiniteLogits& e) {
    if (prompt_printed) std::fputs("\n", stdout);  // the error line starts a line of its own
    fail("sample: ", e.logit, ": the weights in '", weights_file(args.checkpoint, args.weights), "' are not usable");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  print_prompt();
  std::fputs(text.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (args.report_layers) report_layers(*l.model, args.options.tokens, seconds);
  return 0;
}

}  // namespace

Command sample_command() {
  return {"sample", "generate text from a checkpoint", [](CLI::App& s) -> CommandRunner {
            auto args = std::make_shared<SampleArgs>();
            s.add_option("--checkpoint", args->checkpoint, "run directory (or checkpoint.bin)")->required();
            s.add_option("--prompt", args->prompt, "text to continue ('-': read it from stdin)")->default_str("\\n");
            s.add_option("--prompt-file", args->prompt_file, "read the text to continue from this UTF-8 file")
                ->excludes("--prompt");
            s.add_option("--weights", args->weights, "safetensors file replacing the checkpoint's weights");
            number_option(&s, "--tokens", args->options.tokens, "tokens to generate (0: print the prompt only)",
                          integer_up_to(kMaxCount))
                ->capture_default_str();
            number_option(&s, "--temperature", args->options.temperature, "softmax temperature (0 = greedy)",
                          finite_at_least_zero)
                ->capture_default_str();
            number_option(&s, "--top-k", args->options.top_k,
                          "keep the k most likely tokens (0 = off)", integer_up_to(kMaxCount))
                ->capture_default_str();
            number_option(&s, "--top-p", args->options.top_p, "nucleus sampling mass (1 = off)", probability_mass)
                ->capture_default_str();
            number_option(&s, "--seed", args->options.seed, "random seed", integer_up_to(UINT64_MAX))
                ->capture_default_str();
            number_option(&s, "--context", args->options.context,
                          "positions softmax layers keep (0 = block size; past block size needs a scheme without a table)",
                          integer_up_to(kMaxCount))
                ->capture_default_str();
            add_knn_flags(&s, args->knn);
            s.add_option("--png", args->png,
                         "draw images instead: --images samples of --tokens pixel letters (a = blank), "
                                               "printed one per line and drawn as a grid in this PNG (a model trained on "
                                               "scripts/digits.py's images)");
            number_option(&s, "--image-width", args->image_width,
                          "with --png: pixels per image row", integer_up_to(kMaxCount));
            number_option(&s, "--images", args->images, "with --png: images to sample", integer_up_to(kMaxCount))
                ->capture_default_str();

            s.add_flag("--report-layers", args->report_layers,
                        "print the figures the model's layers log on stderr (an early-exit model: the mean layers used; "
                        "ACT: the mean steps) and the tokens per second of generation");
            s.add_flag("--full-depth", args->full_depth,
                       "run every layer (ACT: every step) for every position, also after it left or halted: the same "
                       "text, none of the time early exit and halting save");
            number_option(&s, "--exit-threshold", args->exit_threshold,
                          "an early-exit model's confidence threshold for this run instead of the calibrated one (> 1: "
                          "no exits, every token from the last layer)");
            return [args](const CommandContext&) { return run_sample(*args); };
          }};
}

}  // namespace tapeformer
