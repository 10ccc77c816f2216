#include "tapeformer/train/run_directory.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/train/metrics.h"

namespace tapeformer {
namespace fs = std::filesystem;

RunDirectory::RunDirectory(std::string dir, bool writes) : dir_(std::move(dir)), writes_(writes) {}

void RunDirectory::claim(const std::vector<std::string>& kept) {
  if (!writes_) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  TAPEFORMER_CHECK(fs::is_directory(dir_), "cannot create output directory '", dir_, "'",
                   ec ? ": " + ec.message() : "");
  lock_ = std::make_unique<RunLock>(dir_);
  remove_stale_temp_files(kept);
}

void RunDirectory::lock_existing() {
  if (writes_ && fs::is_directory(dir_)) lock_ = std::make_unique<RunLock>(dir_);
}

void RunDirectory::remove_stale_temp_files(const std::vector<std::string>& kept) const {
  if (!writes_) return;
  tapeformer::remove_stale_temp_files(checkpoint_path());
  tapeformer::remove_stale_temp_files(metrics_path());
  for (const std::string& f : kept) tapeformer::remove_stale_temp_files(f);
}

void RunDirectory::save(const Checkpoint& c, int64_t step) {
  if (!writes_) return;
  try {
    save_checkpoint(checkpoint_path(), c);
  } catch (const std::runtime_error& e) {  // Error, or a library's own; not bad_alloc
    fail("cannot save the checkpoint of step ", step, ": ", e.what(),
         saved_step_ >= 0 ? "; the checkpoint of step " + std::to_string(saved_step_) + " is untouched"
                          : std::string("; no checkpoint was written"));
  }
  saved_step_ = step;
}

std::string RunDirectory::checkpoint_note() const {
  return saved_step_ >= 0 ? "; the checkpoint of step " + std::to_string(saved_step_) + " ('" + checkpoint_path() +
                                "') is kept"
                          : "; no checkpoint was written yet";
}

double RunDirectory::trim_metrics_after(int64_t last_step) const {
  std::ifstream in(metrics_path());
  if (!in.good()) return NAN;
  std::string line, kept;
  double loss = NAN;
  while (std::getline(in, line)) {
    const std::optional<MetricsRecord> r = MetricsRecord::parse(line);
    if (!r || r->step > last_step) continue;
    if (r->step == last_step && std::isnan(loss)) loss = r->train_loss;
    kept += line + "\n";
  }
  if (writes_) write_file_atomic(metrics_path(), kept);
  return loss;
}

}  // namespace tapeformer
