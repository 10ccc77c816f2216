// `tapeformer export`: a checkpoint's weights as safetensors (train/export.h).
#include <cstdio>
#include <memory>
#include <string>

#include "tapeformer/commands/command.h"
#include "tapeformer/core/error.h"
#include "tapeformer/train/export.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/run_directory.h"

namespace tapeformer {
namespace {

struct ExportArgs {
  std::string checkpoint;  // run directory or checkpoint file
  std::string output;      // the file to write
  std::string format = "safetensors";
};
// Writes the checkpoint's weights (train/export.h); prints one line naming the file.
int run_export(const ExportArgs& args);

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

}  // namespace

Command export_command() {
  return {"export", "write a checkpoint's weights as safetensors (nanoGPT's names for a GPT)",
          [](CLI::App& x) -> CommandRunner {
            auto args = std::make_shared<ExportArgs>();
            x.add_option("--checkpoint", args->checkpoint, "run directory (or checkpoint.bin)")->required();
            x.add_option("-o,--output", args->output, "the file to write")->required();
            x.add_option("--format", args->format, "safetensors")->capture_default_str();
            return [args](const CommandContext&) { return run_export(*args); };
          }};
}

}  // namespace tapeformer
