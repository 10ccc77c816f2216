// `tapeformer import-hf`: a GPT-2 checkpoint directory as transformers saves
// it, made a run that train --resume fine-tunes (train/hf_gpt2.h).
#include <cstdio>
#include <memory>
#include <string>

#include "tapeformer/commands/command.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/program_name.h"
#include "tapeformer/train/hf_gpt2.h"

namespace tapeformer {
namespace {

struct ImportArgs {
  std::string dir;  // config.json, model.safetensors, tokenizer files
  std::string out;  // the run directory to make
  int64_t block_size = 0;  // cut the position table to this many rows (0: keep n_positions)
};

int run_import(const ImportArgs& args) {
  TAPEFORMER_CHECK(args.block_size >= 0, "import-hf: --block-size must be >= 1, got ", args.block_size);
  const HfGpt2 hf = read_hf_gpt2(args.dir, args.block_size);
  write_imported_run(hf, args.out);
  const ModelConfig& m = hf.cfg.model;
  std::printf("import-hf: wrote %s/checkpoint.bin (GPT-2, %lld parameters: %lld layers, %lld heads, width %lld, "
              "context %lld, %lld tokens)\n",
              args.out.c_str(), static_cast<long long>(hf.model->num_parameters()), static_cast<long long>(m.n_layer),
              static_cast<long long>(m.n_head), static_cast<long long>(m.n_embd), static_cast<long long>(m.block_size),
              static_cast<long long>(m.vocab_size));
  std::printf("import-hf: fine-tune it with: %s train --resume --out %s --data FILE --set train.max_iters=N\n",
              program_name().c_str(), args.out.c_str());
  return 0;
}

}  // namespace

Command import_hf_command() {
  return {"import-hf", "read a Hugging Face GPT-2 checkpoint directory (config.json, model.safetensors, tokenizer) into "
          "a run to fine-tune, sample or evaluate",
          [](CLI::App& x) -> CommandRunner {
            auto args = std::make_shared<ImportArgs>();
            x.add_option("dir", args->dir, "the directory transformers' save_pretrained wrote")->required();
            x.add_option("--out", args->out, "the run directory to make")->required();
            number_option(&x, "--block-size", args->block_size, "train on this context: the position table is cut to its "
                         "first N rows (nanoGPT's crop_block_size; default: all of n_positions)");
            return [args](const CommandContext&) { return run_import(*args); };
          }};
}

}  // namespace tapeformer
