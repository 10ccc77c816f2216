#include "tapeformer/train/commands.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/token_file.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/train/export.h"
#include "tapeformer/train/image.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/process_group.h"
#include "tapeformer/train/evaluator.h"
#include "tapeformer/train/knn.h"
#include "tapeformer/train/model_hooks.h"
#include "tapeformer/train/run_directory.h"
#include "tapeformer/train/trainer.h"
#include "tapeformer/train/windows.h"

namespace tapeformer {
namespace fs = std::filesystem;
namespace {

// The file a checkpoint's model has its weights from, for errors about them.
std::string weights_file(const std::string& checkpoint, const std::string& weights) {
  return weights.empty() ? checkpoint_file(checkpoint) : weights;
}

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

// The model kind's hooks for `eval` or `sample` (`who`), reading with
// `context` positions (sampling; 0: a text). With --knn, refused when the
// kind takes no mixture.
std::unique_ptr<ModelHooks> command_hooks(const Loaded& l, int64_t context, const KnnOptions& knn, const char* who) {
  HookSite site;
  site.cfg = &l.cfg;
  site.tokenizer = l.tokenizer.get();
  if (knn.on()) {  // before the kind's hooks open anything
    HookSite probe = site;
    const std::string why = make_model_hooks(probe)->refuses_mixture();
    TAPEFORMER_CHECK(why.empty(), who, ": --knn mixes a kNN-LM into a model's output; ", why);
  }
  site.context = context;
  return make_model_hooks(site);
}

}  // namespace

std::string checkpoint_file(const std::string& checkpoint) {
  return fs::is_directory(checkpoint) ? (fs::path(checkpoint) / "checkpoint.bin").string() : checkpoint;
}

std::unique_ptr<LanguageModel> load_checkpoint_model(const Checkpoint& c, const ModelConfig& cfg,
                                                     const std::string& path) {
  Rng unused(0);
  std::unique_ptr<LanguageModel> model = make_model(cfg, unused);
  try {
    model->load_state(c.model);
  } catch (const Error& e) {
    fail("checkpoint '", path, "' does not match its own config: ", e.what());
  }
  model->eval();
  return model;
}

Loaded load_model(const Checkpoint& c, const std::string& path, const std::string& weights) {
  Loaded l;
  l.cfg = TrainConfig::parse(c.config_json, "in checkpoint '" + path + "'");
  TAPEFORMER_CHECK(!c.tokenizer.empty(), "checkpoint '", path, "' holds no tokenizer, so it reads no text: it was "
                   "trained on ", task_run_origin(l.cfg.model.arch));
  l.tokenizer = load_tokenizer(c.tokenizer);
  l.cfg.model.vocab_size = l.tokenizer->vocab_size();
  l.model = load_checkpoint_model(c, l.cfg.model, path);
  if (!weights.empty()) import_safetensors(*l.model, weights);  // the checkpoint's config, these weights
  return l;
}

Loaded load_model(const std::string& checkpoint, const std::string& weights) {
  const std::string path = checkpoint_file(checkpoint);
  return load_model(load_checkpoint(path), path, weights);
}

bool key_may_change_on_resume(const std::string& key) {
  return key == "train.max_iters" || key == "train.threads" || key == "train.shards" || key == "train.precision" ||
         key == "data.path" ||
         key.rfind("eval.", 0) == 0 || key.rfind("checkpoint.", 0) == 0 || key.rfind("log.", 0) == 0;
}

void adopt_resume_config(TrainConfig& saved, const TrainConfig& wanted, const std::string& out_dir) {
  const auto was = saved.fields(), now = wanted.fields();
  for (size_t i = 0; i < was.size(); ++i) {
    if (was[i].second != now[i].second && !key_may_change_on_resume(was[i].first))
      fail("cannot resume '", out_dir, "': the checkpoint was trained with ", was[i].first, " = ", was[i].second,
           " but the config asks for ", now[i].second,
           " (only train.max_iters, train.threads, train.shards, train.precision, data.path, eval.*, checkpoint.* and log.* may change)");
  }
  const int64_t vocab_size = saved.model.vocab_size;
  saved = wanted;
  saved.model.vocab_size = vocab_size;
}

int run_train(const TrainArgs& args) {
  const std::string ckpt = (fs::path(args.out) / "checkpoint.bin").string();
  for (const char* name : {"checkpoint.bin", "metrics.jsonl", "profile.json"})
    RunDirectory::check_not_input("train", (fs::path(args.out) / name).string(), {args.config, args.data});
  std::unique_ptr<Trainer> trainer;
  if (args.resume) {
    TAPEFORMER_CHECK(fs::exists(ckpt), "--resume: no checkpoint at '", ckpt, "'");
    trainer = Trainer::resume(args.out, [&](TrainConfig& saved) {
      TrainConfig wanted = args.config.empty() ? TrainConfig::parse(saved.to_json(), "of the checkpoint", args.overrides)
                                               : TrainConfig::load(args.config, args.overrides);
      if (!args.data.empty()) wanted.data.path = args.data;
      if (wanted.data.path.empty()) wanted.data.path = saved.data.path;
      wanted.validate();  // --data may be a path a checkpoint cannot store
      adopt_resume_config(saved, wanted, args.out);
    });
  } else {
    TAPEFORMER_CHECK(!args.config.empty(), "train: --config is required (or --resume to continue a run)");
    TAPEFORMER_CHECK(!fs::exists(ckpt), "'", args.out,
                     "' already holds a checkpoint: continue it with --resume, or choose another --out");
    TrainConfig cfg = TrainConfig::load(args.config, args.overrides);
    if (!args.data.empty()) cfg.data.path = args.data;
    trainer = std::make_unique<Trainer>(cfg, args.out);
    // Checked again under the run lock: a run that ended meanwhile may have saved one.
    TAPEFORMER_CHECK(!fs::exists(ckpt), "'", args.out,
                     "' already holds a checkpoint: continue it with --resume, or choose another --out");
  }
  trainer->set_profile(args.profile);
  const TrainResult r = trainer->run();
  const std::shared_ptr<ProcessGroup> group = ProcessGroup::world();
  if (group && group->rank() != 0) return 0;  // rank 0 prints the run's result
  std::printf("%s\n", r.to_json().c_str());
  std::fflush(stdout);
  return 0;
}

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

// What --report-layers says when the layers logged nothing.
constexpr const char* kNoLayerFigures =
    "the model's layers logged no figures here (layers that adapt their depth log them only while they adapt: "
    "an early-exit model once `tapeformer calibrate` has set its threshold, a Universal Transformer always)";

// The figures layers log, one line each on stderr ("sample: exit_layers_mean 2.31").
void report_layers(const LanguageModel& model) {
  const auto layers = model.layer_metrics();
  if (layers.empty()) std::fprintf(stderr, "sample: %s\n", kNoLayerFigures);
  for (const auto& [name, values] : layers) {
    std::string line = "sample: " + name;
    for (double v : values) line += " " + json_number(v);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}
}  // namespace

int run_sample(const SampleArgs& args) {
  args.options.validate();  // before anything reaches stdout
  const std::string prompt_str = prompt_text(args);
  Loaded l = load_model(args.checkpoint, args.weights);
  std::vector<int32_t> prompt;
  try {
    prompt = l.tokenizer->encode(prompt_str);
  } catch (const Error& e) {
    fail(args.prompt_file.empty() ? "prompt" : "--prompt-file '" + args.prompt_file + "'", ": ", e.what());
  }
  const int64_t context = sample_context(*l.model, args.options);  // refused before anything reaches stdout
  // The model kind's hooks (the extra inputs of every token fed), and kNN-LM's mixture.
  std::unique_ptr<ModelHooks> hooks = command_hooks(l, context, args.knn, "sample");
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
    if (args.report_layers) report_layers(*l.model);
    return 0;
  }
  StreamDecoder text(*l.tokenizer);  // a byte token waits for the rest of its character
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
  print_prompt();
  std::fputs(text.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (args.report_layers) report_layers(*l.model);
  return 0;
}

EvalResult evaluate_file(const std::string& checkpoint, const std::string& data_path, int64_t context,
                         const std::string& weights) {
  EvalArgs args;
  args.checkpoint = checkpoint;
  args.data = data_path;
  args.context = context;
  args.weights = weights;
  return evaluate_file(args);
}

EvalResult evaluate_file(const EvalArgs& args) {
  TAPEFORMER_CHECK(args.context >= 0, "eval: context must be >= 0 (0: the block size), got ", args.context);
  if (args.knn.on()) args.knn.validate();
  Loaded l = load_model(args.checkpoint, args.weights);
  const int64_t limit = l.model->max_positions();
  const int64_t T = args.context > 0 ? args.context : l.cfg.model.block_size;
  TAPEFORMER_CHECK(limit < 0 || T <= limit, "eval: context ", T, " exceeds the ", limit,
                   " positions of model.positional \"", l.cfg.model.positional,
                   "\" (its table ends at model.block_size); a positional scheme without a table takes any context");
  std::unique_ptr<ModelHooks> hooks = command_hooks(l, 0, args.knn, "eval");  // the model kind's extra inputs
  // lambda = 0 mixes nothing: the model's own loss, bit for bit
  const std::unique_ptr<KnnMixture> mixture = knn_mixture(args.knn, l.cfg, *l.model, *l.tokenizer);
  const EvalText text = read_eval_text(args.data, *l.tokenizer, args.split, l.cfg.data.val_fraction);
  const int64_t n = static_cast<int64_t>(text.ids.size());
  // A model with a segment memory reads the text as one stream, carrying its
  // memories (eval.mem_len positions, default model.mem_len).
  const Evaluator::TextLoss t = Evaluator(*l.model, {hooks.get(), mixture.get()}).text_loss(text, T, l.cfg.eval.mem_len);
  const double total = t.loss_sum;
  const int64_t counted = t.counted;
  const double per_char = static_cast<double>(n) / static_cast<double>(text.characters);
  const double loss = total / static_cast<double>(counted);
  TAPEFORMER_CHECK(std::isfinite(loss), "the model's loss on the data is ", std::isnan(loss) ? "nan" : "inf",
                   ": the weights in '",
                   weights_file(args.checkpoint, args.weights), "' are not usable");
  EvalResult r;
  r.loss = loss;
  r.tokens = counted;
  r.tokens_per_char = per_char;
  r.lm_loss = t.lm_loss_sum / static_cast<double>(counted);
  r.knn_keys = mixture ? mixture->keys() : 0;
  r.layers = l.model->layer_metrics();
  return r;
}

double EvalResult::bpc() const { return loss / std::log(2.0) * tokens_per_char; }
double EvalResult::perplexity() const { return std::exp(loss); }

int run_eval(const EvalArgs& args) {
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

int run_export(const ExportArgs& args) {
  TAPEFORMER_CHECK(args.format == "safetensors", "export: --format must be \"safetensors\", got \"", args.format,
                   "\"");
  RunDirectory::check_output("export", args.output, {checkpoint_file(args.checkpoint)});
  Loaded l = load_model(args.checkpoint);
  export_safetensors(*l.model, args.output);
  std::printf("export: wrote %s (%lld parameters, safetensors)\n", args.output.c_str(),
              static_cast<long long>(l.model->num_parameters()));
  return 0;
}

int run_prepare(const PrepareArgs& args) {
  // A directory that does not exist yet holds none of the inputs: prepare makes it.
  for (const char* name : {"train.bin", "val.bin", "tokenizer.bin"})
    if (fs::is_directory(args.out))
      RunDirectory::check_output("prepare", (fs::path(args.out) / name).string(), {args.data, args.tokenizer.sp_model});
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const PreparedFiles p = prepare_token_files(args.data, args.out, args.tokenizer, args.val_fraction,
                                              [&](const char* stage, int64_t done, int64_t total) {
                                                if (!tty) return;
                                                std::fprintf(stderr, "\rprepare: %-10s %3.0f%% of %lld MB", stage,
                                                             100.0 * static_cast<double>(done) / static_cast<double>(total),
                                                             static_cast<long long>(total >> 20));
                                                std::fflush(stderr);
                                              });
  if (tty) std::fprintf(stderr, "\n");
  std::printf("{\"train_tokens\": %lld, \"val_tokens\": %lld, \"vocab_size\": %lld, \"out\": \"%s\"}\n",
              static_cast<long long>(p.train_tokens), static_cast<long long>(p.val_tokens),
              static_cast<long long>(p.vocab_size), args.out.c_str());
  return 0;
}

}  // namespace tapeformer
