#include <doctest/doctest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>

#include <filesystem>
#include <fstream>

#include "tapeformer/core/error.h"
#include "file_size_limit.h"
#include "temp_dir.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/metrics.h"

using namespace tapeformer;
namespace fs = std::filesystem;

namespace {
Checkpoint sample_checkpoint() {
  Checkpoint c;
  c.config_json = "{\"a\": 1}";
  c.tokenizer = std::string("tok\0bytes", 9);
  c.model = {{"w", Tensor::from({2, 3}, {1, 2, 3, 4, 5, 6})}, {"b", Tensor::from({3}, {7, 8, 9})}};
  c.optimizer = {{"exp_avg.w", Tensor::full({2, 3}, 0.5f)}};
  c.optimizer_step = 41;
  c.step = 42;
  c.train_seconds = 1.25;
  c.rng = Rng(5);
  (void)c.rng.normal();
  c.sampler = "sampler-state";
  c.train_loss = 2.5;
  return c;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_all(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}
}  // namespace

TEST_CASE("checkpoint: save/load round trip keeps every field") {
  TempDir dir("ckpt-roundtrip");
  const std::string path = (dir.path / "checkpoint.bin").string();
  const Checkpoint c = sample_checkpoint();
  save_checkpoint(path, c);
  const Checkpoint r = load_checkpoint(path);
  CHECK(r.config_json == c.config_json);
  CHECK(r.tokenizer == c.tokenizer);
  REQUIRE(r.model.size() == 2);
  CHECK(r.model[0].first == "w");
  CHECK(r.model[0].second.shape() == Shape{2, 3});
  CHECK(r.model[0].second.to_vector() == c.model[0].second.to_vector());
  CHECK(r.optimizer[0].first == "exp_avg.w");
  CHECK(r.optimizer_step == 41);
  CHECK(r.step == 42);
  CHECK(r.train_seconds == 1.25);
  CHECK(r.rng == c.rng);
  CHECK(r.sampler == "sampler-state");
  // No temporary file is left behind.
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("checkpoint: truncated, corrupted, foreign and missing files get one clear error each") {
  TempDir dir("ckpt-damaged");
  const fs::path path = dir.path / "checkpoint.bin";
  save_checkpoint(path.string(), sample_checkpoint());
  const std::string good = read_all(path);

  write_all(path, good.substr(0, good.size() - 10));
  CHECK_THROWS_WITH_AS(load_checkpoint(path.string()), doctest::Contains("truncated"), Error);

  write_all(path, good + "extra");
  CHECK_THROWS_WITH_AS(load_checkpoint(path.string()), doctest::Contains("corrupted (5 bytes after the"), Error);

  std::string bad = good;
  bad[bad.size() / 2] ^= 0x5a;
  write_all(path, bad);
  CHECK_THROWS_WITH_AS(load_checkpoint(path.string()), doctest::Contains("corrupted (checksum mismatch)"), Error);

  write_all(path, "hello, this is not a checkpoint at all");
  CHECK_THROWS_WITH_AS(load_checkpoint(path.string()), doctest::Contains("not a tapeformer checkpoint"), Error);

  write_all(path, "");
  CHECK_THROWS_WITH_AS(load_checkpoint(path.string()), doctest::Contains("not a tapeformer checkpoint"), Error);

  bad = good;
  bad[8] = 9;  // format version
  write_all(path, bad);
  CHECK_THROWS_WITH_AS(load_checkpoint(path.string()), doctest::Contains("format version 9 is not supported"), Error);

  CHECK_THROWS_WITH_AS(load_checkpoint((dir.path / "nope.bin").string()), doctest::Contains("cannot open"), Error);
}

TEST_CASE("checkpoint: damaged fields behind a valid checksum are refused, counts before allocating") {
  // Found by tests/fuzz/fuzz_checkpoint. The payload (after the 28-byte
  // header) is edited and re-wrapped so that its checksum matches again.
  TempDir dir("ckpt-fields");
  const fs::path path = dir.path / "checkpoint.bin";
  save_checkpoint(path.string(), sample_checkpoint());
  const std::string good = read_all(path).substr(28);
  const auto load_payload = [&](const std::string& payload) {
    write_all(path, checkpoint_file_bytes(payload));
    return load_checkpoint(path.string());
  };
  CHECK(load_payload(good).step == 42);  // re-wrapping alone changes nothing

  // The payload starts with the config string's u64 length.
  std::string p = good;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(p.data(), &huge, 8);
  CHECK_THROWS_WITH_AS(load_payload(p), doctest::Contains("cannot decode payload (the config: a count of 1099511627776, more than the"), Error);
  CHECK_THROWS_WITH_AS(load_payload(good + "x"), doctest::Contains("stray bytes after the last field: 1"), Error);

  // The tail: ... step (i64), train_seconds (f64), rng (32 + 1 + 4 bytes), sampler (u64 count + 13 bytes),
  // train_loss (f64), eval_pending (u8).
  const size_t pending_at = good.size() - 1, loss_at = pending_at - 8, sampler_at = loss_at - (8 + 13), rng_flag_at = sampler_at - 4 - 1,
               seconds_at = rng_flag_at - 32 - 8, step_at = seconds_at - 8;
  int64_t step = 0;
  std::memcpy(&step, good.data() + step_at, 8);
  REQUIRE(step == 42);  // the layout assumed above
  p = good;
  const int64_t negative = -5;
  std::memcpy(p.data() + step_at, &negative, 8);
  CHECK_THROWS_WITH_AS(load_payload(p), doctest::Contains("step -5 / optimizer step 41 outside [0, 2^24]"), Error);
  p = good;
  const double nan = std::nan("");
  std::memcpy(p.data() + seconds_at, &nan, 8);
  CHECK_THROWS_WITH_AS(load_payload(p), doctest::Contains("training time nan s is not a finite duration"), Error);
  p = good;
  p[rng_flag_at] = 2;
  CHECK_THROWS_WITH_AS(load_payload(p), doctest::Contains("the cached-normal flag must be 0 or 1, got 2"), Error);
  p = good;
  std::memcpy(p.data() + loss_at, &nan, 8);
  CHECK_THROWS_WITH_AS(load_payload(p), doctest::Contains("the loss of step 42 is nan"), Error);
  p = good;
  p[pending_at] = 2;
  CHECK_THROWS_WITH_AS(load_payload(p), doctest::Contains("the evaluation-pending flag is 2, not 0 or 1"), Error);
  p[pending_at] = 1;
  CHECK(load_payload(p).eval_pending);
  CHECK_FALSE(load_payload(good).eval_pending);

  // A version 2 file (no eval_pending) still loads, no evaluation pending.
  std::string v2 = checkpoint_file_bytes(p.substr(0, pending_at));
  v2[8] = 2;
  write_all(path, v2);
  CHECK(load_checkpoint(path.string()).train_loss == 2.5);
  CHECK_FALSE(load_checkpoint(path.string()).eval_pending);
  // A version 1 file (no train_loss) still loads, its loss unknown.
  std::string v1 = checkpoint_file_bytes(good.substr(0, loss_at));
  v1[8] = 1;
  write_all(path, v1);
  const Checkpoint old = load_checkpoint(path.string());
  CHECK(old.step == 42);
  CHECK(std::isnan(old.train_loss));
  CHECK(load_payload(good).train_loss == 2.5);
}

TEST_CASE("checkpoint: overwriting keeps the old file until the new one is complete") {
  TempDir dir("ckpt-overwrite");
  const fs::path path = dir.path / "checkpoint.bin";
  Checkpoint c = sample_checkpoint();
  save_checkpoint(path.string(), c);
  c.step = 43;
  save_checkpoint(path.string(), c);
  CHECK(load_checkpoint(path.string()).step == 43);
  // A write that fails (its temp file cannot be created: a directory is in the
  // way) throws and leaves the previous checkpoint whole.
  const fs::path blocker = dir.path / (".checkpoint.bin.tmp." + std::to_string(::getpid()));
  fs::create_directory(blocker);
  c.step = 44;
  CHECK_THROWS_WITH_AS(save_checkpoint(path.string(), c), doctest::Contains("cannot write"), Error);
  CHECK(load_checkpoint(path.string()).step == 43);
  fs::remove(blocker);
  // Writing into a directory that does not exist fails cleanly and names the file.
  CHECK_THROWS_WITH_AS(save_checkpoint((dir.path / "missing" / "c.bin").string(), c),
                       doctest::Contains("cannot write"), Error);
}

TEST_CASE("checkpoint: a write cut short (disk full) throws, removes its temp file and keeps the old checkpoint") {
  TempDir dir("ckpt-full");
  const fs::path path = dir.path / "checkpoint.bin";
  Checkpoint c = sample_checkpoint();
  save_checkpoint(path.string(), c);
  const auto size = static_cast<rlim_t>(fs::file_size(path));
  // A file size limit below the checkpoint's size makes write() fail part way
  // (EFBIG), as a full disk would. Only save_checkpoint runs under the limit.
  // The limit and the ignored SIGXFSZ are undone on leaving the block.
  c.step = 44;
  std::string error;
  {
    FileSizeLimit limit(size / 2);
    try {
      save_checkpoint(path.string(), c);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  CHECK(error.find("writing '") != std::string::npos);
  CHECK(error.find("failed: File too large") != std::string::npos);
  CHECK(load_checkpoint(path.string()).step == 42);
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("metrics lines round-trip through MetricsRecord::parse; broken lines are rejected") {
  MetricsRecord r;
  r.step = 250;
  r.lr = 9.5e-4;
  r.train_loss = 1.8125;
  r.val_loss = 1.9375;
  r.val_bpc = 2.796875;
  r.grad_norm = 0.25;
  r.tokens_per_s = 31000.5;
  r.elapsed_s = 12.5;
  const std::string line = r.to_json();
  const auto back = MetricsRecord::parse(line);
  REQUIRE(back.has_value());
  CHECK(back->step == 250);
  CHECK(back->lr == r.lr);
  CHECK(back->train_loss == r.train_loss);
  REQUIRE(back->val_loss.has_value());
  CHECK(*back->val_loss == *r.val_loss);
  REQUIRE(back->val_bpc.has_value());
  CHECK(*back->val_bpc == *r.val_bpc);
  CHECK(back->grad_norm == r.grad_norm);
  CHECK(back->elapsed_s == r.elapsed_s);
  CHECK(back->layers.empty());
  CHECK(back->extra.empty());
  // Per-layer and a program's own figures come back in the written order.
  r.layers = {{"ponder_mean", {2.5}}, {"0.attn.spans", {3, 1, 4}}};
  r.extra = {{"accuracy", 0.75}, {"ponder_steps", 3.25}};
  const auto figures = MetricsRecord::parse(r.to_json());
  REQUIRE(figures.has_value());
  CHECK(figures->layers == r.layers);
  CHECK(figures->extra == r.extra);
  CHECK(figures->to_json() == r.to_json());
  r.layers.clear();
  r.extra.clear();
  r.val_loss.reset();
  r.val_bpc.reset();
  CHECK_FALSE(MetricsRecord::parse(r.to_json())->val_loss.has_value());
  CHECK_FALSE(MetricsRecord::parse(r.to_json())->val_bpc.has_value());
  CHECK_FALSE(MetricsRecord::parse(line.substr(0, line.size() / 2)).has_value());  // killed mid-write
  CHECK_FALSE(MetricsRecord::parse("").has_value());
  CHECK_FALSE(MetricsRecord::parse("[1, 2]").has_value());
  CHECK_FALSE(MetricsRecord::parse(R"({"step": "ten"})").has_value());
}
