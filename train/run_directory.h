// RunDirectory: what a training run keeps on disk, and the rules that keep
// it: OUT/checkpoint.bin (written atomically, never over a run another
// process holds), OUT/metrics.jsonl (trimmed to the checkpoint on resume),
// the run lock, and the files a model kind's hooks keep there (SPALM's
// tables). Rank 0 of a distributed run writes; the other ranks only ask.
//
//   RunDirectory dir(out, /*writes=*/true);
//   dir.claim({"OUT/spalm_train.table"});         // a fresh run: create, lock, clear leftovers
//   dir.save(checkpoint, step);                  // atomic; Error naming the step and what is kept
//   RunDirectory::check_output("export", out, {checkpoint});   // never over an input or a run's file
//   dir.trim_metrics_after(step);                // a resumed run's metrics end at its checkpoint
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/run_lock.h"

namespace tapeformer {

class RunDirectory {
 public:
  // writes: this process writes the directory (rank 0); the others do nothing.
  RunDirectory(std::string dir, bool writes);

  const std::string& path() const { return dir_; }
  bool writes() const { return writes_; }
  std::string checkpoint_path() const { return dir_ + "/checkpoint.bin"; }
  std::string metrics_path() const { return dir_ + "/metrics.jsonl"; }

  // A fresh run's directory, created after the build (so a run refused for
  // its data or config leaves none behind) and locked for this process; the
  // leftovers of atomic writes cut short by a kill are removed, for the
  // checkpoint, the metrics and `kept` (files the hooks write there).
  void claim(const std::vector<std::string>& kept);
  // A resumed run's: locked when it exists (another process still training
  // there would overwrite what this one writes).
  void lock_existing();
  // Leftovers of atomic writes (the checkpoint's, the metrics', `kept`'s).
  void remove_stale_temp_files(const std::vector<std::string>& kept) const;

  // Error when the path no longer names the directory this process locked
  // (removed, or removed and made again by another run): called before
  // every write, so an old run never writes over a new one's files.
  void check_held() const;

  // Writes the checkpoint atomically (rank 0) after check_held(); an Error
  // names the step and the checkpoint that is kept.
  void save(const Checkpoint& c, int64_t step);
  // The step of the checkpoint on disk (-1: none yet).
  int64_t saved_step() const { return saved_step_; }
  void set_saved_step(int64_t step) { saved_step_ = step; }
  // For divergence errors: what the user still has.
  std::string checkpoint_note() const;

  // The files a run directory keeps: checkpoint.bin, metrics.jsonl,
  // train.lock, profile.json and the tables a model kind keeps there (*.table).
  static bool is_run_file_name(const std::string& name);
  // A directory holding a run lock or a checkpoint.
  static bool is_run_directory(const std::string& dir);
  // Refuses, with an Error naming both, to write `output` when it is one of
  // the command's own `inputs` (the same file by any path: links, "..") or
  // a file a run directory keeps, and when its directory does not exist or
  // is not writable, so that a command fails before its work, not after.
  // `who` names the command ("export").
  static void check_output(const std::string& who, const std::string& output, const std::vector<std::string>& inputs);
  // Only the first rule: for a run's own files (train's checkpoint against its --data).
  static void check_not_input(const std::string& who, const std::string& output, const std::vector<std::string>& inputs);

  // On resume, metrics written after the checkpoint by the interrupted run
  // are dropped (and so is a half-written last line), so metrics.jsonl
  // describes one continuous run. Returns the train loss of the line of step
  // `last_step`, or NaN (what a version 1 checkpoint does not hold).
  double trim_metrics_after(int64_t last_step) const;

 private:
  std::string dir_;
  bool writes_;
  std::unique_ptr<RunLock> lock_;
  int64_t saved_step_ = -1;
};

}  // namespace tapeformer
