// The kNN-LM flags `eval` and `sample` share (train/knn.h): a helper of
// the commands, not a command.
#pragma once

#include <CLI/CLI.hpp>

#include "tapeformer/commands/flags.h"
#include "tapeformer/train/knn.h"

namespace tapeformer {

// The kNN-LM flags of eval and sample (train/knn.h).
inline void add_knn_flags(CLI::App* c, KnnOptions& knn) {
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

}  // namespace tapeformer
