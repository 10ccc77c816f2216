// `tapeformer export`: a checkpoint's weights as safetensors (train/export.h),
// or the whole model as a Hugging Face GPT-2 directory (train/hf_gpt2.h).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "tapeformer/commands/command.h"
#include "tapeformer/core/error.h"
#include "tapeformer/train/export.h"
#include "tapeformer/train/hf_gpt2.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/run_directory.h"

namespace tapeformer {
namespace {

struct ExportArgs {
  std::string checkpoint;  // run directory or checkpoint file
  std::string output;      // the file (safetensors) or directory (hf) to write
  std::string format = "safetensors";  // "safetensors" | "hf"
};
// Writes the checkpoint's weights (train/export.h); prints one line naming the file.
int run_export(const ExportArgs& args);

int run_export(const ExportArgs& args) {
  TAPEFORMER_CHECK(args.format == "safetensors" || args.format == "hf",
                   "export: --format must be \"safetensors\" or \"hf\", got \"", args.format, "\"");
  if (args.format == "hf") {
    std::error_code ec;
    TAPEFORMER_CHECK(!std::filesystem::exists(args.output, ec) || std::filesystem::is_directory(args.output, ec),
                     "export --format hf: '", args.output, "' is a file; -o names the directory to write");
    Loaded l = load_model(args.checkpoint);
    write_hf_gpt2(*l.model, *l.tokenizer, args.output);
    std::printf("export: wrote %s (%lld parameters, a Hugging Face GPT-2 directory)\n", args.output.c_str(),
                static_cast<long long>(l.model->num_parameters()));
    return 0;
  }
  RunDirectory::check_output("export", args.output, {checkpoint_file(args.checkpoint)});
  Loaded l = load_model(args.checkpoint);
  export_safetensors(*l.model, args.output);
  std::printf("export: wrote %s (%lld parameters, safetensors)\n", args.output.c_str(),
              static_cast<long long>(l.model->num_parameters()));
  return 0;
}

}  // namespace

Command export_command() {
  return {"export", "write a checkpoint's weights as safetensors (nanoGPT's names for a GPT), or a GPT-2 as "
          "transformers' directory (--format hf)",
          [](CLI::App& x) -> CommandRunner {
            auto args = std::make_shared<ExportArgs>();
            x.add_option("--checkpoint", args->checkpoint, "run directory (or checkpoint.bin)")->required();
            x.add_option("-o,--output", args->output, "the file to write (a directory with --format hf)")->required();
            x.add_option("--format", args->format, "safetensors | hf (config.json, model.safetensors and the "
                         "tokenizer files, which transformers' from_pretrained reads)")->capture_default_str();
            return [args](const CommandContext&) { return run_export(*args); };
          }};
}

}  // namespace tapeformer
