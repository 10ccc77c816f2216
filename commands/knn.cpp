// `tapeformer knn build`: a kNN-LM datastore of a checkpoint's context
// vectors over a text (train/knn.h), for eval and sample --knn.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tapeformer/commands/command.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/train/knn.h"
#include "tapeformer/train/metrics.h"

namespace tapeformer {
namespace {

// build_knn_store, its progress on stderr (train/metrics.h: quick work
// stays quiet); prints {"store", "keys", "dim", "index", "seconds"} on stdout.
int run_knn_build(const KnnBuildArgs& args) {
  ProgressScope progress("knn build");
  const auto started = std::chrono::steady_clock::now();
  const Datastore store = build_knn_store(args);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("{\"store\": %s, \"keys\": %lld, \"dim\": %lld, \"index\": \"%s\", \"seconds\": %.3f}\n",
              nlohmann::json(args.out).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str(),
              static_cast<long long>(store.size()), static_cast<long long>(store.info().dim),
              store.index().options().describe().c_str(), seconds);
  return 0;
}

}  // namespace

Command knn_command() {
  return {"knn", "kNN-LM datastores (knn build)", [](CLI::App& kn) -> CommandRunner {
            auto args = std::make_shared<KnnBuildArgs>();
              kn.require_subcommand(1);
              auto* kb = kn.add_subcommand("build",
                                           "a datastore of a checkpoint's context vectors over a text, for eval/sample --knn");
              kb->add_option("--checkpoint", args->checkpoint, "run directory (or checkpoint.bin)")->required();
              kb->add_option("--weights", args->weights, "safetensors file replacing the checkpoint's weights");
              kb->add_option("--data", args->data, "text file whose positions become keys")->required();
              kb->add_option("--split", args->split,
                             "all | train | val: the part of the file (the run's data.val_fraction)")
                  ->check(CLI::IsMember({"all", "train", "val"}))
                  ->capture_default_str();
              kb->add_option("--out", args->out, "the store file to write")->required();
              number_option(kb, "--context", args->context, "window length in tokens (0 = block size), as eval's",
                            integer_up_to(kMaxCount))
                  ->capture_default_str();
              kb->add_option("--index", args->index.kind, "exact | ivf | hnsw")
                  ->check(CLI::IsMember({"exact", "ivf", "hnsw"}))
                  ->capture_default_str();
              number_option(kb, "--nlist", args->index.nlist, "ivf: cells (0 = 4 sqrt(keys))", integer_up_to(kMaxCount))
                  ->capture_default_str();
              number_option(kb, "--nprobe", args->index.nprobe,
                            "ivf: cells scanned per query", integer_in(1, kMaxCount))
                  ->capture_default_str();
              number_option(kb, "--hnsw-m", args->index.hnsw_m, "hnsw: links per node", integer_in(2, 512))
                  ->capture_default_str();
              number_option(kb, "--ef-search", args->index.ef_search, "hnsw: candidates kept while searching",
                            integer_in(1, 1 << 20))
                  ->capture_default_str();
            return [args](const CommandContext&) { return run_knn_build(*args); };
          }};
}

}  // namespace tapeformer
