// The `tapeformer` command as a library entry: cli/main.cpp is only
// `return tapeformer::cli_main(argc, argv);`, and a program that registers
// kinds of its own calls the same function (see cli/cli.h).
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>

#include "tapeformer/cli/cli.h"
#include "tapeformer/cli/flags.h"
#include "tapeformer/cli/kinds.h"
#include "tapeformer/core/build_info.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/layers/memory/memory.h"
#include "tapeformer/layers/mlp.h"
#include "tapeformer/layers/positional/positional.h"
#include "tapeformer/train/check.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/commands.h"
#include "tapeformer/train/process_group.h"
#include "tapeformer/train/calibrate.h"
#include "tapeformer/train/plot.h"
#include "tapeformer/train/rl_commands.h"
#include "tapeformer/train/trainer.h"

namespace tapeformer {

namespace {

constexpr uint64_t kMaxCount = INT32_MAX;  // tokens, top-k, context, vocabulary size: as config counts

// A kind that a config or checkpoint names but this program lacks was most
// likely registered by another program (a user's, built on cli_main).
std::string with_registration_hint(const std::string& what) {
  if (what.find(": unknown kind \"") == std::string::npos) return what;
  return what + "; a kind of your own is known only to a program that registers it before calling "
                "tapeformer::cli_main (docs/custom-layers.md): run that program instead of the stock command";
}

// The kNN-LM flags of eval and sample (train/knn.h).
void add_knn_flags(CLI::App* c, KnnOptions& knn) {
  c->add_option("--knn", knn.store, "mix in kNN-LM with this store (from tapeformer knn build)");
  number_option(c, "--knn-k", knn.k, "neighbours per position (at most the store's keys)", integer_in(1, kMaxCount))
      ->capture_default_str();
  number_option(c, "--knn-lambda", knn.lambda, "weight of the kNN distribution: p = l p_kNN + (1 - l) p_LM",
                unit_interval)
      ->capture_default_str();
  number_option(c, "--knn-temperature", knn.temperature, "p_kNN ~ exp(-distance / temperature)", finite_above_zero)
      ->capture_default_str();
  number_option(c, "--knn-nprobe", knn.nprobe, "ivf store: cells scanned per query (0: as built)",
                integer_up_to(kMaxCount));
  number_option(c, "--knn-ef-search", knn.ef_search, "hnsw store: candidates kept while searching (0: as built)",
                integer_up_to(kMaxCount));
}

}  // namespace

namespace {

// This process's rank in an mpirun job, or -1 when it is the only process.
int job_rank() {
  try {
    const std::shared_ptr<ProcessGroup> g = ProcessGroup::world();
    return g ? g->rank() : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

// The error line (naming the rank in a distributed run); then the whole job
// ends, since the other ranks may be waiting for this one in a collective.
int fail_job(const std::string& what) {
  std::fflush(stdout);
  const int rank = job_rank();
  if (rank >= 0) {
    std::fprintf(stderr, "tapeformer: error: rank %d: %s\n", rank, what.c_str());
    std::fflush(stderr);
    ProcessGroup::abort_job(1);
  } else {
    std::fprintf(stderr, "tapeformer: error: %s\n", what.c_str());
  }
  return 1;
}

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

int cli_main(int argc, char** argv) {
  // A write past `ulimit -f` then fails with EFBIG, and the writer names the
  // file, instead of the process dying with no word (prepare, export, train).
  std::signal(SIGXFSZ, SIG_IGN);
  if (argc > 0 && argv[0] != nullptr) {  // messages name the command the user ran
    const std::string path = argv[0];
    set_program_name(path.substr(path.find_last_of('/') + 1));
  }
  CLI::App app{"tapeformer: train small Transformer language models on a CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tapeformer ") + TAPEFORMER_VERSION + " (checkpoint format " +
                                        std::to_string(kCheckpointVersion) + "; " + vector_description() + "; " +
                                        (kernels::bf16_unsupported().empty() ? "bf16 products on AVX512-BF16"
                                                                             : "bf16 products: not on this CPU") +
                                        ")");
  app.fallthrough();  // --threads works before or after the subcommand
  // Command-line mistakes get one line, like every other error.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("tapeformer: error: ") + e.what() + " (see --help)\n";
  });

  TrainArgs train;
  auto* t = app.add_subcommand("train", "train a model from a JSON config");
  t->add_option("--config", train.config, "JSON config (configs/*.json); optional with --resume");
  t->add_option("--data", train.data, "text file to train on (overrides data.path)");
  t->add_option("--out", train.out, "output directory for checkpoint.bin and metrics.jsonl")->capture_default_str();
  t->add_option("--set", train.overrides, "override a config value: --set train.max_iters=500 (repeatable)");
  t->add_flag("--resume", train.resume, "continue the run saved in --out");
  t->add_flag("--profile", train.profile,
              "time the steps by phase and kernel, count their allocations; print the table at the end and "
              "write it to OUT/profile.json");

  SampleArgs sample;
  auto* s = app.add_subcommand("sample", "generate text from a checkpoint");
  s->add_option("--checkpoint", sample.checkpoint, "run directory (or checkpoint.bin)")->required();
  s->add_option("--prompt", sample.prompt, "text to continue ('-': read it from stdin)")->default_str("\\n");
  s->add_option("--prompt-file", sample.prompt_file, "read the text to continue from this UTF-8 file")
      ->excludes("--prompt");
  s->add_option("--weights", sample.weights, "safetensors file replacing the checkpoint's weights");
  number_option(s, "--tokens", sample.options.tokens, "tokens to generate (0: print the prompt only)",
                integer_up_to(kMaxCount))
      ->capture_default_str();
  number_option(s, "--temperature", sample.options.temperature, "softmax temperature (0 = greedy)",
                finite_at_least_zero)
      ->capture_default_str();
  number_option(s, "--top-k", sample.options.top_k, "keep the k most likely tokens (0 = off)", integer_up_to(kMaxCount))
      ->capture_default_str();
  number_option(s, "--top-p", sample.options.top_p, "nucleus sampling mass (1 = off)", probability_mass)
      ->capture_default_str();
  number_option(s, "--seed", sample.options.seed, "random seed", integer_up_to(UINT64_MAX))
      ->capture_default_str();
  number_option(s, "--context", sample.options.context,
                "positions softmax layers keep (0 = block size; past block size needs a scheme without a table)",
                integer_up_to(kMaxCount))
      ->capture_default_str();
  add_knn_flags(s, sample.knn);
  s->add_option("--png", sample.png, "draw images instead: --images samples of --tokens pixel letters (a = blank), "
                                     "printed one per line and drawn as a grid in this PNG (a model trained on "
                                     "scripts/digits.py's images)");
  number_option(s, "--image-width", sample.image_width, "with --png: pixels per image row", integer_up_to(kMaxCount));
  number_option(s, "--images", sample.images, "with --png: images to sample", integer_up_to(kMaxCount))
      ->capture_default_str();

  s->add_flag("--report-layers", sample.report_layers,
              "print the figures the model's layers log on stderr (an early-exit model: the mean layers used)");

  EvalArgs eval;
  auto* e = app.add_subcommand("eval", "loss, bits per char and perplexity of a checkpoint on a text file");
  e->add_option("--checkpoint", eval.checkpoint, "run directory (or checkpoint.bin)")->required();
  e->add_option("--data", eval.data, "text file to evaluate on")->required();
  e->add_option("--weights", eval.weights, "safetensors file replacing the checkpoint's weights");
  number_option(e, "--context", eval.context,
                "window length in tokens (0 = block size; past block size needs a scheme without a table)",
                integer_up_to(kMaxCount))
      ->capture_default_str();
  e->add_option("--split", eval.split, "all | train | val: the part of the file (the run's data.val_fraction)")
      ->check(CLI::IsMember({"all", "train", "val"}))
      ->capture_default_str();
  add_knn_flags(e, eval.knn);
  e->add_flag("--report-layers", eval.report_layers,
              "add the figures the model's layers log to the JSON line (\"layers\": an early-exit model's mean layers used)");

  CalibrateArgs calibrate;
  auto* cb = app.add_subcommand("calibrate", "choose an early-exit model's threshold on held-out text and write it "
                                             "into the run (Learn-then-Test or a grid search)");
  cb->add_option("--checkpoint", calibrate.run, "run directory (its checkpoint.bin gets the threshold)")->required();
  cb->add_option("--data", calibrate.data, "held-out text file (default: the run's data.path)");
  cb->add_option("--split", calibrate.split, "all | train | val: the part of the file (the run's data.val_fraction)")
      ->check(CLI::IsMember({"all", "train", "val"}))
      ->capture_default_str();
  cb->add_option("--method", calibrate.method, "ltt (a guarantee) | grid (the smallest threshold within delta) | "
                                                "evaluate (read with --threshold, write nothing)")
      ->check(CLI::IsMember({"ltt", "grid", "evaluate"}))
      ->capture_default_str();
  cb->add_option("--confidence", calibrate.confidence, "max | margin | cosine (default: the model's)")
      ->check(CLI::IsMember({"max", "margin", "cosine"}));
  number_option(cb, "--delta", calibrate.delta, "tolerance: a window's share of tokens unlike the full model's",
                open_fraction)
      ->capture_default_str();
  number_option(cb, "--epsilon", calibrate.epsilon, "ltt: the risk level", open_fraction)->capture_default_str();
  number_option(cb, "--threshold", calibrate.threshold, "evaluate: the threshold to read with")->capture_default_str();
  number_option(cb, "--windows", calibrate.windows, "windows of the text to use (0: all)", integer_up_to(kMaxCount))
      ->capture_default_str();
  number_option(cb, "--splits", calibrate.splits, "random halvings checking the guarantee", integer_in(1, 1 << 20))
      ->capture_default_str();
  number_option(cb, "--seed", calibrate.seed, "the halving into calibration and test windows")->capture_default_str();
  cb->add_option("--sweep", calibrate.sweep, "write one JSON line per threshold tried (gap, loss, mean layers used)");
  cb->add_flag("--dry-run", calibrate.dry_run, "print the result without writing the run");

  KnnBuildArgs knn_build;
  auto* kn = app.add_subcommand("knn", "kNN-LM datastores (knn build)");
  kn->require_subcommand(1);
  auto* kb = kn->add_subcommand("build", "a datastore of a checkpoint's context vectors over a text, for eval/sample --knn");
  kb->add_option("--checkpoint", knn_build.checkpoint, "run directory (or checkpoint.bin)")->required();
  kb->add_option("--weights", knn_build.weights, "safetensors file replacing the checkpoint's weights");
  kb->add_option("--data", knn_build.data, "text file whose positions become keys")->required();
  kb->add_option("--split", knn_build.split, "all | train | val: the part of the file (the run's data.val_fraction)")
      ->check(CLI::IsMember({"all", "train", "val"}))
      ->capture_default_str();
  kb->add_option("--out", knn_build.out, "the store file to write")->required();
  number_option(kb, "--context", knn_build.context, "window length in tokens (0 = block size), as eval's",
                integer_up_to(kMaxCount))
      ->capture_default_str();
  kb->add_option("--index", knn_build.index.kind, "exact | ivf | hnsw")
      ->check(CLI::IsMember({"exact", "ivf", "hnsw"}))
      ->capture_default_str();
  number_option(kb, "--nlist", knn_build.index.nlist, "ivf: cells (0 = 4 sqrt(keys))", integer_up_to(kMaxCount))
      ->capture_default_str();
  number_option(kb, "--nprobe", knn_build.index.nprobe, "ivf: cells scanned per query", integer_in(1, kMaxCount))
      ->capture_default_str();
  number_option(kb, "--hnsw-m", knn_build.index.hnsw_m, "hnsw: links per node", integer_in(2, 512))
      ->capture_default_str();
  number_option(kb, "--ef-search", knn_build.index.ef_search, "hnsw: candidates kept while searching",
                integer_in(1, 1 << 20))
      ->capture_default_str();

  RlCollectArgs rl_collect;
  auto* rl = app.add_subcommand("rl", "offline reinforcement learning: rl collect, rl train, rl eval");
  rl->require_subcommand(1);
  auto* rc = rl->add_subcommand("collect", "play episodes of an environment with scripted behaviour policies and "
                                           "write them as a dataset");
  rc->add_option("--env", rl_collect.env, "keys_doors | tmaze")->required();
  rc->add_option("--option", rl_collect.options, "an environment option name=value (tmaze: corridor=30; repeatable)");
  rc->add_option("--policy", rl_collect.policy, "behaviour policies with weights: random, noisy, expert, e.g. "
                                                 "random:0.7,noisy:0.3")
      ->capture_default_str();
  number_option(rc, "--epsilon", rl_collect.epsilon, "noisy: the chance of a random action")->capture_default_str();
  number_option(rc, "--episodes", rl_collect.episodes, "episodes to play", integer_in(1, 1 << 24))
      ->capture_default_str();
  number_option(rc, "--seed", rl_collect.seed, "the episodes' layouts and the policies' draws")->capture_default_str();
  rc->add_option("--out", rl_collect.out, "the dataset file to write")->required();
  RlTrainArgs rl_train;
  auto* rt = rl->add_subcommand("train", "train a Decision Transformer (or behaviour cloning) on a dataset's episodes");
  rt->add_option("--config", rl_train.config, "training config (model, optimizer, schedule, train, eval)");
  rt->add_option("--data", rl_train.data, "the dataset (rl collect); with --resume, default: the run's");
  rt->add_option("--out", rl_train.out, "run directory")->required();
  rt->add_option("--set", rl_train.overrides, "override a config value (repeatable)");
  rt->add_flag("--resume", rl_train.resume, "continue the run saved in --out");
  RlEvalArgs rl_eval;
  auto* re = rl->add_subcommand("eval", "the trained policy acting in its dataset's environment, conditioned on a "
                                        "target return");
  re->add_option("--checkpoint", rl_eval.checkpoint, "run directory of rl train")->required();
  number_option(re, "--target-return", rl_eval.target_return, "the return asked for at the first step")->required();
  number_option(re, "--episodes", rl_eval.episodes, "episodes to play", integer_in(1, 1 << 20))
      ->capture_default_str();
  number_option(re, "--seed", rl_eval.seed, "the episodes' layouts (none is in a dataset)")->capture_default_str();
  re->add_option("--log", rl_eval.log, "also append the result line to this file (tapeformer plot --achieved draws it)");

  PrepareArgs prep;
  auto* pr = app.add_subcommand("prepare", "write a text file as token files (train.bin, val.bin) to train on");
  pr->add_option("--data", prep.data, "the text file")->required();
  pr->add_option("--out", prep.out, "directory for train.bin, val.bin and tokenizer.bin")->required();
  pr->add_option("--tokenizer", prep.tokenizer.kind, "char | byte | sentencepiece")->capture_default_str();
  number_option(pr, "--vocab-size", prep.tokenizer.vocab_size, "sentencepiece: pieces to learn from the train split",
                integer_up_to(kMaxCount));
  pr->add_option("--sp-type", prep.tokenizer.sp_type, "sentencepiece: bpe | unigram")->capture_default_str();
  pr->add_option("--sp-model", prep.tokenizer.sp_model, "sentencepiece: an existing .model file instead of learning one");
  number_option(pr, "--val-fraction", prep.val_fraction, "the last fraction of the text is validation", open_fraction)
      ->capture_default_str();

  ExportArgs exp;
  auto* x = app.add_subcommand("export", "write a checkpoint's weights as safetensors (nanoGPT's names for a GPT)");
  x->add_option("--checkpoint", exp.checkpoint, "run directory (or checkpoint.bin)")->required();
  x->add_option("-o,--output", exp.output, "the file to write")->required();
  x->add_option("--format", exp.format, "safetensors")->capture_default_str();

  PlotArgs plot;
  auto* pl = app.add_subcommand("plot", "train and val loss curves of runs on shared axes, as a PNG (gnuplot)");
  pl->add_option("runs", plot.runs, "run directories (each with metrics.jsonl); with --achieved, rl eval --log files")
      ->required();
  pl->add_option("-o,--output", plot.output, "the PNG to write")->required();
  pl->add_flag("--log-y", plot.log_y, "logarithmic loss axis");
  pl->add_flag("!--no-train", plot.train, "validation curves only");
  pl->add_option("--layer", plot.layer,
                 "draw a per-layer figure the runs log instead of the losses (ponder_mean against the step; "
                 "ponder_hist, a list, at the last evaluation)");
  pl->add_flag("--achieved", plot.achieved,
               "draw the achieved return (mean and sd) against the target return of rl eval --log files");

  std::vector<std::string> check_names;
  auto* ck = app.add_subcommand("check", "run the conformance checks on registered kinds: parameters, causality, "
                                         "generation, resume, gradient");
  ck->add_option("--kind", check_names,
                 "FAMILY=NAME, e.g. model.attention=softcap (repeatable; default: every kind of model.attention, "
                 "model.positional, model.block, model.mlp, memory and model.arch)");

  bool markdown = false;
  auto* k = app.add_subcommand("kinds", "list every family of kinds, each kind's summary and the keys it declares");
  k->add_flag("--markdown", markdown, "as Markdown (docs/kinds.md)");
  bool readme = false;
  k->add_flag("--readme", readme, "README.md's tables of the model families, with their markers")
      ->excludes("--markdown");
  bool json = false;
  k->add_flag("--json", json, "as JSON, for scripts (each kind's options with their defaults and small test values)")
      ->excludes("--markdown")
      ->excludes("--readme");

  int threads = -1;
  number_option(&app, "--threads", threads, "worker threads (default: train.threads, $TAPEFORMER_THREADS or all cores)",
                integer_up_to(1024));

  try {
    check_number_options(app);
  } catch (const std::exception& err) {
    return fail_job(err.what());
  }

  const std::string first = argc > 1 ? argv[1] : "";
  std::string commands;  // "train, sample, ... or check": the subcommands, in the order they were added
  bool known = false;
  const std::vector<CLI::App*> all = app.get_subcommands([](CLI::App*) { return true; });
  for (size_t i = 0; i < all.size(); ++i) {
    known = known || all[i]->get_name() == first;
    commands += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i]->get_name();
  }
  if (!first.empty() && first[0] != '-' && !known) {
    std::fprintf(stderr, "tapeformer: error: unknown command '%s' (expected %s; see --help)\n", argv[1],
                 commands.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    const int code = app.exit(err);  // prints help, or the one-line failure message
    return code == 0 ? 0 : 2;
  }
  try {
    if (threads >= 0) {
      parallel::set_num_threads(threads);
      train.overrides.push_back("train.threads=" + std::to_string(threads));
      rl_train.overrides.push_back("train.threads=" + std::to_string(threads));
    }
    if (*t) return run_train(train);
    if (*s) return run_sample(sample);
    if (*e) return run_eval(eval);
    if (*pl) return run_plot(plot);
    if (*x) return run_export(exp);
    if (*pr) return run_prepare(prep);
    if (*kb) return run_knn_build(knn_build);
    if (*ck) return run_check(check_names);
    if (*cb) return run_calibrate(calibrate);
    if (*rc) return run_rl_collect(rl_collect);
    if (*rt) return run_rl_train(rl_train);
    if (*re) return run_rl_eval(rl_eval);
    if (*k) {
      std::fputs((json ? kinds_json() : readme ? kinds_readme() : kinds_listing(markdown)).c_str(), stdout);
      return 0;
    }
  } catch (const Interrupted& stop) {  // a checkpoint of the last step was saved (every rank stops together)
    std::fflush(stdout);
    if (job_rank() <= 0) std::fprintf(stderr, "tapeformer: %s\n", stop.what());
    return 128 + stop.signal();
  } catch (const Diverged& diverged) {  // every rank sees the same loss and weights, and stops together
    std::fflush(stdout);
    if (job_rank() <= 0) std::fprintf(stderr, "tapeformer: error: %s\n", diverged.what());
    return 3;
  } catch (const std::bad_alloc&) {
    // Advice only where the command has those sizes to give.
    return fail_job(*t || *rt ? "out of memory; make the model, batch or block size smaller"
                    : *rc     ? "rl collect: out of memory; collect fewer or shorter episodes (--episodes, --option)"
                              : "out of memory");
  } catch (const std::exception& err) {
    return fail_job(with_registration_hint(err.what()));
  }
  return 0;
}

}  // namespace tapeformer
