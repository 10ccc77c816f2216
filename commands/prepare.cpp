// `tapeformer prepare`: a text file as token files to train on (data/token_file.h).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "tapeformer/commands/command.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/data/token_file.h"
#include "tapeformer/train/run_directory.h"

namespace tapeformer {
namespace {
namespace fs = std::filesystem;

struct PrepareArgs {
  std::string data;                // the text file
  std::string out;                 // the directory for train.bin, val.bin, tokenizer.bin
  TokenizerOptions tokenizer;      // kind "char" | "byte" | "sentencepiece" (+ vocab_size, sp_type, sp_model)
  double val_fraction = 0.1;
};
// Writes nanoGPT-style token files (data/token_file.h) with a progress bar
// on stderr (when it is a terminal); prints {"train_tokens", "val_tokens", "vocab_size"} on stdout.
// Train on them with --data DIR (or data.path = DIR).
int run_prepare(const PrepareArgs& args);

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

}  // namespace

Command prepare_command() {
  return {"prepare", "write a text file as token files (train.bin, val.bin) to train on",
          [](CLI::App& pr) -> CommandRunner {
            auto args = std::make_shared<PrepareArgs>();
            pr.add_option("--data", args->data, "the text file")->required();
            pr.add_option("--out", args->out, "directory for train.bin, val.bin and tokenizer.bin")->required();
            pr.add_option("--tokenizer", args->tokenizer.kind, "char | byte | sentencepiece")->capture_default_str();
            number_option(&pr, "--vocab-size", args->tokenizer.vocab_size,
                          "sentencepiece: pieces to learn from the train split",
                          integer_up_to(kMaxCount));
            pr.add_option("--sp-type", args->tokenizer.sp_type, "sentencepiece: bpe | unigram")->capture_default_str();
            pr.add_option("--sp-model", args->tokenizer.sp_model,
                          "sentencepiece: an existing .model file instead of learning one");
            number_option(&pr, "--val-fraction", args->val_fraction,
                          "the last fraction of the text is validation", open_fraction)
                ->capture_default_str();
            return [args](const CommandContext&) { return run_prepare(*args); };
          }};
}

}  // namespace tapeformer
