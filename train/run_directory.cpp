#include "tapeformer/train/run_directory.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
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

void RunDirectory::check_held() const {
  if (lock_) lock_->check_held();
}

void RunDirectory::save(const Checkpoint& c, int64_t step) {
  if (!writes_) return;
  check_held();
  // Through the locked directory itself: a directory removed and made again
  // meanwhile under the same path is never written.
  const std::string target = lock_ ? lock_->path_in("checkpoint.bin") : checkpoint_path();
  try {
    save_checkpoint(target, c);
  } catch (const std::runtime_error& e) {  // Error, or a library's own; not bad_alloc
    check_held();  // the directory went while writing: say so
    std::string what = e.what();
    const std::string dir_of_target = target.substr(0, target.size() - std::string("checkpoint.bin").size());
    for (size_t at = what.find(dir_of_target); at != std::string::npos; at = what.find(dir_of_target, at))
      what.replace(at, dir_of_target.size(), dir_ + "/");  // the user's path in the message, not /proc's
    fail("cannot save the checkpoint of step ", step, ": ", what,
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
  if (writes_) {
    check_held();
    write_file_atomic(lock_ ? lock_->path_in("metrics.jsonl") : metrics_path(), kept);
  }
  return loss;
}

bool RunDirectory::is_run_file_name(const std::string& name) {
  static const char* const kFiles[] = {"checkpoint.bin", "metrics.jsonl", RunLock::file_name(), "profile.json"};
  for (const char* f : kFiles)
    if (name == f) return true;
  const std::string table = ".table";
  return name.size() > table.size() && name.compare(name.size() - table.size(), table.size(), table) == 0;
}

bool RunDirectory::is_run_directory(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) &&
         (fs::exists(fs::path(dir) / RunLock::file_name(), ec) || fs::exists(fs::path(dir) / "checkpoint.bin", ec));
}

namespace {
// The path with symbolic links and "."/".." resolved as far as it exists.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::path(p).lexically_normal() : r;
}
}  // namespace

void RunDirectory::check_not_input(const std::string& who, const std::string& output,
                                   const std::vector<std::string>& inputs) {
  const fs::path out = resolved(output);
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    std::error_code ec;
    const bool same = resolved(in) == out || (fs::exists(output, ec) && fs::equivalent(in, output, ec));
    TAPEFORMER_CHECK(!same, who, ": the output '", output, "' is the input '", in,
                     "': writing it would destroy what is being read; choose another output file");
  }
}

void RunDirectory::check_output(const std::string& who, const std::string& output,
                                const std::vector<std::string>& inputs) {
  check_not_input(who, output, inputs);
  const fs::path out = resolved(output), parent = out.parent_path();
  TAPEFORMER_CHECK(!(is_run_file_name(out.filename().string()) && is_run_directory(parent.string())), who,
                   ": the output '", output, "' is the ", out.filename().string(), " of the run directory '",
                   parent.string(), "': writing it would break that run; choose another output file");
  const fs::path dir = fs::path(output).has_parent_path() ? fs::path(output).parent_path() : fs::path(".");
  std::error_code ec;
  TAPEFORMER_CHECK(fs::is_directory(dir, ec), who, ": cannot write '", output, "': its directory '", dir.string(),
                   "' does not exist");
  TAPEFORMER_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, who, ": cannot write '", output, "': its directory '",
                   dir.string(), "' is not writable (", std::strerror(errno), ")");
}

}  // namespace tapeformer
