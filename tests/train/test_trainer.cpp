// End-to-end training on tiny models: it learns, and a resumed run continues
// the identical curve.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/token_file.h"
#include "temp_dir.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/trainer.h"
#include "memory_models.h"

using namespace tapeformer;
using memory_models::group_of;
using memory_models::held;
namespace fs = std::filesystem;

namespace {

TrainConfig tiny(const std::string& data, int64_t steps) {
  TrainConfig c = TrainConfig::parse(R"({
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16},
    "train": {"batch_size": 8, "seed": 5},
    "optimizer": {"lr": 0.01, "weight_decay": 0.0},
    "schedule": {"name": "constant"},
    "eval": {"interval": 10, "iters": 2, "final_iters": 4},
    "checkpoint": {"interval": 20},
    "log": {"interval": 5}})", "test");
  c.data.path = data;
  c.train.max_iters = steps;
  return c;
}

// `n` lines "Line K: to be or not to be." with K scattered over 0..999.
std::string numbered_lines(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) text += "Line " + std::to_string(i * 7919 % 1000) + ": to be or not to be.\n";
  return text;
}

std::string write_text(const fs::path& dir, const std::string& text) {
  const fs::path p = dir / "data.txt";
  std::ofstream(p) << text;
  return p.string();
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// metrics.jsonl without the timing fields (they differ between runs).
std::string without_timing(const std::string& jsonl) {
  std::stringstream in(jsonl), out;
  for (std::string line; std::getline(in, line);) out << line.substr(0, line.find(",\"tokens_per_s\"")) << "\n";
  return out.str();
}

}  // namespace

TEST_CASE("a tiny GPT overfits a 200-character string to near-zero loss") {
  TempDir dir("trainer-overfit");
  std::string text;
  const std::string words = "the cat sat on the mat; a dog ran far. ";
  while (text.size() < 200) text += words;
  text.resize(200);
  // Train split = the string, block = 199: one window, memorised position by
  // position. The validation split is the same string again.
  TrainConfig c = tiny(write_text(dir.path, text + text), 150);
  c.data.val_fraction = 0.5;
  c.model.block_size = 199;
  c.schedule.name = "cosine";
  c.schedule.warmup_iters = 10;
  c.schedule.decay_iters = 150;
  c.schedule.min_lr = 1e-3;
  Trainer t(c, (dir.path / "run").string());
  const TrainResult r = t.run();
  CHECK(r.steps == 150);
  CHECK(r.train_loss < 0.01);
  CHECK(r.val_loss < 0.01);
  // The final line reports the validation loss also in bits per character and as perplexity.
  char expected[96];
  std::snprintf(expected, sizeof expected, "\"val_bpc\": %.6f, \"val_perplexity\": %.4f", r.val_loss / std::log(2.0),
                std::exp(r.val_loss));
  CHECK_MESSAGE(r.to_json().find(expected) != std::string::npos, r.to_json());
  CHECK(fs::exists(dir.path / "run" / "checkpoint.bin"));
  CHECK(fs::exists(dir.path / "run" / "metrics.jsonl"));
}

// Trains 40 steps straight, and 20 + a resumed 20, with `configure` applied
// to both; the two must end identically.
void check_resume_is_exact(const std::string& label, const std::function<void(TrainConfig&)>& configure) {
  CAPTURE(label);
  TempDir dir("trainer-resume-" + label);
  const std::string text = numbered_lines(80);
  const std::string data = write_text(dir.path, text);
  const auto config = [&](int64_t steps) {
    TrainConfig c = tiny(data, steps);
    configure(c);
    return c;
  };

  TrainResult straight;
  {
    Trainer t(config(40), (dir.path / "straight").string());
    straight = t.run();
  }
  {
    Trainer t(config(20), (dir.path / "split").string());
    t.run();
  }
  TrainResult resumed;
  {
    auto t = Trainer::resume((dir.path / "split").string(), [](TrainConfig& c) { c.train.max_iters = 40; });
    resumed = t->run();
  }
  CHECK(resumed.steps == 40);
  CHECK(resumed.train_loss == straight.train_loss);
  CHECK(resumed.val_loss == straight.val_loss);
  // Resuming a finished run runs no step and reports the same final line
  // (its train loss comes from the checkpoint step's metrics line).
  {
    auto t = Trainer::resume((dir.path / "split").string());
    const TrainResult again = t->run();
    CHECK(again.steps == 40);
    CHECK(again.train_loss == straight.train_loss);
    CHECK(again.val_loss == straight.val_loss);
  }
  // Every metrics line after the checkpoint matches (the split run also logged its
  // end-of-run evaluation at step 20, which the straight run does as well).
  const std::string a = without_timing(read_all(dir.path / "straight" / "metrics.jsonl"));
  const std::string b = without_timing(read_all(dir.path / "split" / "metrics.jsonl"));
  CHECK(a == b);
  // The final checkpoints hold identical parameters.
  const Checkpoint ca = load_checkpoint((dir.path / "straight" / "checkpoint.bin").string());
  const Checkpoint cb = load_checkpoint((dir.path / "split" / "checkpoint.bin").string());
  REQUIRE(ca.model.size() == cb.model.size());
  for (size_t i = 0; i < ca.model.size(); ++i) CHECK(ca.model[i].second.to_vector() == cb.model[i].second.to_vector());
}

TEST_CASE("resume: stopping at step 20 and resuming gives the straight run's curve exactly") {
  check_resume_is_exact("standard", [](TrainConfig&) {});
  // Dropout on, so the resumed run must continue the Rng streams exactly;
  // the reversible stack also replays its masks in the backward.
  check_resume_is_exact("reversible", [](TrainConfig& c) {
    c.model.block = "reversible";
    c.model.n_layer = 2;
    c.model.dropout = 0.1f;
    c.model.options["ff_chunks"] = int64_t{2};
  });
  // Transformer-XL: the stream sampler's place and the segment memory
  // carried between steps are in the checkpoint.
  check_resume_is_exact("transformer-xl", [](TrainConfig& c) {
    c.model.positional = "txl";
    c.model.options["mem_len"] = int64_t{8};
    c.model.options["ext_len"] = int64_t{4};
    c.model.dropout = 0.1f;
  });
  // FAVOR+ redraws its random features every 7 steps: they are in the checkpoint, and the replicas follow.
  check_resume_is_exact("favor", [](TrainConfig& c) {
    c.model.attention = "linear";
    c.model.options["feature_map"] = std::string("favor");
    c.model.options["feature_redraw"] = int64_t{7};
    c.train.shards = 2;
  });
  // Compressive Transformer: both memories are in the checkpoint (rows fall
  // out of the memory of 8 from the second step on).
  check_resume_is_exact("compressive", [](TrainConfig& c) {
    c.model.positional = "txl";
    c.model.options["mem_len"] = int64_t{8};
    c.model.options["cmem_len"] = int64_t{8};
    c.model.options["cmem_ratio"] = int64_t{4};
    c.model.options["cmem_fn"] = std::string("max");
    c.train.shards = 2;
  });
  // Every memory kind, at its small values with the kinds it builds on: all
  // it keeps is in the checkpoint (the learned compression's weights and
  // their optimizer state, the external memory's keys and values), two shards.
  for (const MemoryKind& kind : memory_kinds().kinds()) {
    check_resume_is_exact("memory-" + kind.name, [&kind](TrainConfig& c) {
      c.model.positional = "txl";
      memory_models::turn_on(c.model, kind);
      c.train.shards = 2;
    });
  }
  check_resume_is_exact("gtrxl", [](TrainConfig& c) {
    c.model.block = "gtrxl";
    c.model.positional = "txl";
    c.model.options["mem_len"] = int64_t{8};
    c.model.dropout = 0.1f;
  });
}

TEST_CASE("compressive conv: the trainer backpropagates the reconstruction loss, one shard or two alike") {
  TempDir dir("trainer-compressive-conv");
  const std::string data = write_text(dir.path, numbered_lines(80));
  std::vector<std::vector<float>> learned;
  for (int64_t shards : {1, 2}) {
    TrainConfig c = tiny(data, 10);
    c.model.positional = "txl";
    c.model.options["mem_len"] = int64_t{8};
    c.model.options["cmem_len"] = int64_t{4};
    c.model.options["cmem_fn"] = std::string("conv");
    c.train.shards = shards;
    c.train.batch_size = 4;
    const std::string out = (dir.path / ("run" + std::to_string(shards))).string();
    Trainer(c, out).run();
    const Checkpoint ck = load_checkpoint(out + "/checkpoint.bin");
    for (const auto& [name, value] : ck.model)
      if (name == "compress.0.weight") learned.push_back(value.to_vector());
  }
  REQUIRE(learned.size() == 2);
  // It started as the mean, W = [I/2; I/2]; training moved it, the same way for both shard counts.
  const int64_t C = 32;
  CHECK(learned[0].size() == static_cast<size_t>(2 * C * C));
  CHECK(std::fabs(learned[0][0] - 0.5f) > 1e-4);
  for (size_t i = 0; i < learned[0].size(); ++i) CHECK(learned[1][i] == doctest::Approx(learned[0][i]).epsilon(1e-4));
}

TEST_CASE("a sentencepiece run: vocabulary from the train split, bits per character, the tokenizer in the checkpoint") {
  // The tokenizer is rebuilt from the checkpoint on resume, not learnt again.
  check_resume_is_exact("sentencepiece", [](TrainConfig& c) {
    c.data.tokenizer = "sentencepiece";
    c.data.vocab_size = 290;
  });
  TempDir dir("trainer-sentencepiece");
  const std::string text = numbered_lines(300);
  const std::string data = write_text(dir.path, text);
  TrainConfig c = tiny(data, 10);
  c.data.tokenizer = "sentencepiece";
  c.data.vocab_size = 300;
  Trainer t(c, (dir.path / "run").string());
  const TrainResult r = t.run();
  // The val split is the text's last 10% of characters; its tokens per character set the bits per character.
  const size_t at = split_offset(text, 0.1, true);
  const Loaded l = load_model((dir.path / "run").string());
  REQUIRE(l.tokenizer->kind() == "sentencepiece");
  CHECK(l.tokenizer->vocab_size() == 300);
  CHECK(l.model->config().vocab_size == 300);
  const double per_char = static_cast<double>(l.tokenizer->encode(text.substr(at)).size()) /
                          static_cast<double>(text.size() - at);
  CHECK(per_char < 0.5);
  CHECK(r.val_tokens_per_char == doctest::Approx(per_char).epsilon(1e-12));
  char expected[64];
  std::snprintf(expected, sizeof expected, "\"val_bpc\": %.6f,", r.val_loss / std::log(2.0) * per_char);
  CHECK_MESSAGE(r.to_json().find(expected) != std::string::npos, r.to_json());
  // eval on a text reports per character too.
  const EvalResult e = evaluate_file((dir.path / "run").string(), data);
  CHECK(e.tokens_per_char == doctest::Approx(static_cast<double>(l.tokenizer->encode(text).size()) /
                                             static_cast<double>(text.size())));
  CHECK(e.bpc() == doctest::Approx(e.loss / std::log(2.0) * e.tokens_per_char));
}

TEST_CASE("eval of a model with a memory reads the text as one stream, carrying both memories") {
  TempDir dir("trainer-eval-memory");
  const std::string text = numbered_lines(80);
  const std::string data = write_text(dir.path, text);
  TrainConfig c = tiny(data, 10);
  c.model.positional = "txl";
  c.model.options["mem_len"] = int64_t{8};
  c.model.options["cmem_len"] = int64_t{8};
  c.model.options["cmem_ratio"] = int64_t{4};
  Trainer(c, (dir.path / "run").string()).run();
  const EvalResult e = evaluate_file((dir.path / "run").string(), data);

  // The same text read here segment by segment, once with the memories carried and once without.
  const Loaded l = load_model((dir.path / "run").string());
  const std::vector<int32_t> ids = l.tokenizer->encode(text);
  const int64_t n = static_cast<int64_t>(ids.size()), T = 16;
  NoGradGuard no_grad;
  Rng unused(0);
  SegmentMemory memory;
  double with = 0, without = 0;
  for (int64_t start = 0; start + 1 < n; start += T) {
    const int64_t len = std::min(T, n - 1 - start);
    const IndexTensor x({1, len}, std::vector<int32_t>(ids.begin() + start, ids.begin() + start + len));
    const IndexTensor y({1, len}, std::vector<int32_t>(ids.begin() + start + 1, ids.begin() + start + len + 1));
    with += cross_entropy(l.model->forward(x, memory, unused), y).item() * static_cast<double>(len);
    without += cross_entropy(l.model->forward(x, unused), y).item() * static_cast<double>(len);
  }
  CHECK(held(memory, "compressed") == 8);
  CHECK(e.tokens == n - 1);
  CHECK(e.loss == with / static_cast<double>(n - 1));
  CHECK(e.loss != without / static_cast<double>(n - 1));
}

TEST_CASE("a diverging run ends with its last good checkpoint, which evaluates to a finite loss") {
  TempDir dir("trainer-nan");
  std::string text;
  for (int i = 0; i < 60; ++i) text += "abcdefghij klmnop qrstuv wxyz\n";
  const std::string data = write_text(dir.path, text);
  TrainConfig c = tiny(data, 40);
  c.optimizer.name = "sgd";
  c.optimizer.lr = 100;  // grows each step, then overflows (at step 11 here): a finite loss, then unusable weights
  c.optimizer.grad_clip = 0;
  c.checkpoint.interval = 1;
  Trainer t(c, (dir.path / "run").string());
  std::string message;
  int64_t diverged_at = -1;
  try {
    t.run();
  } catch (const Diverged& e) {
    message = e.what();
    diverged_at = e.step();
  }
  INFO(message);
  REQUIRE(message.find("training diverged: ") != std::string::npos);
  // The message names the kept checkpoint's step, which is the file's, before the step that diverged.
  const std::string kept = "; the checkpoint of step ";
  const auto at = message.find(kept);
  REQUIRE(at != std::string::npos);
  const int64_t kept_step = std::stoll(message.substr(at + kept.size()));
  const std::string path = (dir.path / "run" / "checkpoint.bin").string();
  const Checkpoint last = load_checkpoint(path);
  CHECK(last.step == kept_step);
  CHECK(last.step >= 1);
  CHECK(last.step < diverged_at);
  CHECK(std::isfinite(last.train_loss));
  for (const auto& entry : last.model) {  // a binding cannot go into REQUIRE_MESSAGE's lambda (C++17)
    for (float v : entry.second.to_vector()) REQUIRE_MESSAGE(std::isfinite(v), entry.first);
  }
  // What was kept can be trained on: it evaluates to a finite loss.
  CHECK(std::isfinite(evaluate_file((dir.path / "run").string(), data).loss));

  // Diverging before the first checkpoint says so instead of pointing at a file.
  c.optimizer.lr = 1e30;
  Trainer early(c, (dir.path / "early").string());
  CHECK_THROWS_WITH_AS(early.run(), doctest::Contains("; no checkpoint was written yet"), Diverged);
  CHECK_FALSE(fs::exists(dir.path / "early" / "checkpoint.bin"));
}

TEST_CASE("a run refused for its data creates no output directory; stale temp files are cleared") {
  TempDir dir("trainer-dirs");
  const TrainConfig too_short = tiny(write_text(dir.path, "only a few characters"), 5);
  CHECK_THROWS_WITH_AS(Trainer(too_short, (dir.path / "refused").string()), doctest::Contains("block size"), Error);
  CHECK_FALSE(fs::exists(dir.path / "refused"));

  // A kill during an atomic write leaves ".checkpoint.bin.tmp.PID"; the next run in that directory removes it.
  std::string text;
  for (int i = 0; i < 60; ++i) text += "abcdefghij klmnop qrstuv wxyz\n";
  const TrainConfig c = tiny(write_text(dir.path, text), 20);
  fs::create_directories(dir.path / "run");
  std::ofstream(dir.path / "run" / ".checkpoint.bin.tmp.999999998") << "half a checkpoint";
  std::ofstream(dir.path / "run" / ".metrics.jsonl.tmp.999999998") << "half a log";
  std::ofstream(dir.path / "run" / "notes.txt") << "the user's own file";
  Trainer(c, (dir.path / "run").string()).run();
  CHECK_FALSE(fs::exists(dir.path / "run" / ".checkpoint.bin.tmp.999999998"));
  CHECK_FALSE(fs::exists(dir.path / "run" / ".metrics.jsonl.tmp.999999998"));
  CHECK(fs::exists(dir.path / "run" / "notes.txt"));
  std::ofstream(dir.path / "run" / ".checkpoint.bin.tmp.999999999") << "again";
  // A live process's write in progress (pid 1 always runs) is left alone.
  std::ofstream(dir.path / "run" / ".checkpoint.bin.tmp.1") << "being written";
  Trainer::resume((dir.path / "run").string());
  CHECK_FALSE(fs::exists(dir.path / "run" / ".checkpoint.bin.tmp.999999999"));
  CHECK(fs::exists(dir.path / "run" / ".checkpoint.bin.tmp.1"));
  CHECK(load_checkpoint((dir.path / "run" / "checkpoint.bin").string()).step == 20);
}

TEST_CASE("a byte-level run trains on a file a char-level run rejects (NUL bytes, not UTF-8)") {
  TempDir dir("trainer-bytes");
  std::string bytes;
  for (int i = 0; i < 600; ++i) bytes += static_cast<char>((i * 37) % 256);  // includes 0x00 and invalid UTF-8
  const fs::path p = dir.path / "data.bin";
  std::ofstream(p, std::ios::binary) << bytes;
  TrainConfig c = tiny(p.string(), 3);
  CHECK_THROWS_WITH_AS(Trainer(c, (dir.path / "char").string()), doctest::Contains("binary"), Error);
  c.data.tokenizer = "byte";
  Trainer t(c, (dir.path / "byte").string());
  const TrainResult r = t.run();
  CHECK(r.steps == 3);
  CHECK(std::isfinite(r.val_loss));
}

TEST_CASE("a checkpoint whose weights do not fit its own config is refused naming both") {
  TempDir dir("trainer-mismatch");
  std::string text;
  for (int i = 0; i < 60; ++i) text += "abcdefghij klmnop qrstuv wxyz\n";
  const std::string data = write_text(dir.path, text);
  Trainer(tiny(data, 2), (dir.path / "run").string()).run();
  const std::string path = (dir.path / "run" / "checkpoint.bin").string();
  CHECK(evaluate_file(path, data).tokens > 0);  // the intact checkpoint evaluates
  Checkpoint c = load_checkpoint(path);
  REQUIRE(c.model.size() > 1);
  c.model.pop_back();  // as if written by a build whose model had one tensor fewer
  save_checkpoint(path, c);
  CHECK_THROWS_WITH_AS(evaluate_file(path, data), doctest::Contains("does not match its own config"), Error);
}

TEST_CASE("a run on token files (tapeformer prepare) equals the run on the text they came from") {
  TempDir dir("trainer-token-files");
  const std::string text = numbered_lines(80);
  const std::string data = write_text(dir.path, text);
  prepare_token_files(data, (dir.path / "tokens").string(), TokenizerOptions{}, 0.1);
  TrainResult from_text, from_files;
  {
    Trainer t(tiny(data, 20), (dir.path / "text").string());
    from_text = t.run();
  }
  {
    Trainer t(tiny((dir.path / "tokens").string(), 20), (dir.path / "files").string());
    from_files = t.run();
  }
  CHECK(from_files.train_loss == from_text.train_loss);
  CHECK(from_files.val_loss == from_text.val_loss);
  // Resuming reads the files again.
  auto resumed = Trainer::resume((dir.path / "files").string(), [](TrainConfig& c) { c.train.max_iters = 25; });
  CHECK(resumed->run().steps == 25);
  TrainConfig bytes = tiny((dir.path / "tokens").string(), 5);
  bytes.data.tokenizer = "byte";
  CHECK_THROWS_WITH_AS(Trainer(bytes, (dir.path / "x").string()),
                       doctest::Contains("data.tokenizer is \"byte\" but data directory"), Error);
  CHECK_THROWS_WITH_AS(Trainer(tiny(dir.path.string(), 5), (dir.path / "y").string()),
                       doctest::Contains("has no train.bin and val.bin"), Error);
}

TEST_CASE("a nanoGPT char-level data directory (train.bin, val.bin, meta.pkl) trains as its text does") {
  TempDir dir("trainer-nanogpt");
  const std::string fixtures = std::string(TAPEFORMER_FIXTURE_DIR) + "/nanogpt_char";
  TrainResult from_text, from_files;
  {
    Trainer t(tiny(fixtures + "/input.txt", 15), (dir.path / "text").string());
    from_text = t.run();
  }
  {
    Trainer t(tiny(fixtures, 15), (dir.path / "files").string());
    from_files = t.run();
  }
  CHECK(from_files.train_loss == from_text.train_loss);
  CHECK(from_files.val_loss == from_text.val_loss);
  CHECK(from_files.val_bpc() == from_text.val_bpc());
}

TEST_CASE("--profile: profile.json has the step's phases and kernels, and steady-state steps allocate nothing new") {
  TempDir dir("trainer-profile");
  std::string text;
  while (text.size() < 4000) text += "to be or not to be, that is the question. ";
  TrainConfig c = tiny(write_text(dir.path, text), 12);
  c.model.dropout = 0.1;
  Trainer t(c, (dir.path / "run").string());
  t.set_profile(true);
  const TrainResult r = t.run();
  const std::string json = read_all(dir.path / "run" / "profile.json");
  for (const char* key : {"\"forward + backward\"", "\"optimizer\"", "\"gradient norm\"", "\"matmul\"",
                          "\"attention\"", "\"norm\"", "\"backward_ms_per_step\"", "\"peak_rss_bytes\""})
    CHECK_MESSAGE(json.find(key) != std::string::npos, key);
  CHECK(json.find("\"steps\": 11") != std::string::npos);  // after the warm-up step
  // Every buffer a step needs comes from the reuse cache after the first step
  // (evaluation and checkpoints between steps are not counted).
  CHECK(json.find("\"new_bytes_after_warmup\": 0") != std::string::npos);
  // Profiling changes no result.
  Trainer plain(c, (dir.path / "plain").string());
  CHECK(plain.run().val_loss == r.val_loss);
}

TEST_CASE("bf16: resume exact; the same bits for any thread count and on the portable path; fp32 and back") {
  // The portable path runs on every machine; the fast one where the CPU has AVX512-BF16.
  check_resume_is_exact("bf16-portable", [](TrainConfig& c) {
    c.train.precision = "bf16_portable";
    c.model.dropout = 0.1f;
    c.train.shards = 2;
  });
  TempDir dir("trainer-bf16");
  const std::string data = write_text(dir.path, numbered_lines(80));
  const auto run = [&](const std::string& name, const std::string& precision, int threads) {
    TrainConfig c = tiny(data, 20);
    c.train.precision = precision;
    c.train.threads = threads;
    c.train.shards = 2;
    Trainer t(c, (dir.path / name).string());
    const TrainResult r = t.run();
    return std::make_pair(r, without_timing(read_all(dir.path / name / "metrics.jsonl")));
  };
  const auto [fp32, fp32_lines] = run("fp32", "fp32", 2);
  const auto [portable, portable_lines] = run("portable-1", "bf16_portable", 1);
  const auto [portable2, portable2_lines] = run("portable-2", "bf16_portable", 2);
  CHECK(portable_lines == portable2_lines);
  CHECK(portable.val_loss == portable2.val_loss);
  // bf16 operands move the loss, a little: an fp32 product would leave it as it was.
  CHECK(portable.train_loss != fp32.train_loss);
  CHECK(std::abs(portable.val_loss - fp32.val_loss) < 0.05);
  if (kernels::bf16_unsupported().empty()) {
    const auto [fast, fast_lines] = run("fast", "bf16", 2);
    CHECK(fast_lines == portable_lines);
    const auto [fast1, fast1_lines] = run("fast-1", "bf16", 1);
    CHECK(fast1_lines == portable_lines);
  } else {
    TrainConfig c = tiny(data, 20);
    c.train.precision = "bf16";
    CHECK_THROWS_WITH_AS(Trainer(c, (dir.path / "refused").string()), doctest::Contains("AVX512-BF16"), Error);
    CHECK_FALSE(fs::exists(dir.path / "refused"));
  }
  // A bf16 run resumes in fp32 and back: the checkpoint holds float32 weights.
  {
    auto t = Trainer::resume((dir.path / "portable-2").string(), [](TrainConfig& c) {
      c.train.max_iters = 30;
      c.train.precision = "fp32";
    });
    CHECK(t->run().steps == 30);
  }
  auto t = Trainer::resume((dir.path / "portable-2").string(), [](TrainConfig& c) {
    c.train.max_iters = 40;
    c.train.precision = "bf16_portable";
  });
  CHECK(t->run().steps == 40);
}

TEST_CASE("train.recompute: the same bits as without, resumed either way; bad values refused") {
  check_resume_is_exact("recompute", [](TrainConfig& c) {
    c.train.recompute = "blocks";
    c.model.dropout = 0.1f;
    c.train.shards = 2;
  });
  TempDir dir("trainer-recompute");
  const std::string data = write_text(dir.path, numbered_lines(80));
  const auto run = [&](const std::string& name, const std::string& recompute) {
    TrainConfig c = tiny(data, 12);
    c.model.dropout = 0.1f;
    c.model.n_layer = 3;
    c.train.recompute = recompute;
    c.train.shards = 2;
    Trainer t(c, (dir.path / name).string());
    t.set_quiet(true);
    const TrainResult r = t.run();
    return std::make_pair(r, without_timing(read_all(dir.path / name / "metrics.jsonl")));
  };
  const auto [plain, plain_lines] = run("none", "none");
  const auto [blocks, blocks_lines] = run("blocks", "blocks");
  const auto [every2, every2_lines] = run("every2", "blocks:2");
  CHECK(blocks_lines == plain_lines);
  CHECK(every2_lines == plain_lines);
  CHECK(blocks.val_loss == plain.val_loss);
  // Recompute off on resume, and on again: the checkpoint holds no trace of it.
  auto t = Trainer::resume((dir.path / "blocks").string(), [](TrainConfig& c) {
    c.train.max_iters = 16;
    c.train.recompute = "none";
  });
  t->set_quiet(true);
  CHECK(t->run().steps == 16);
  for (const char* bad : {"all", "blocks:0", "blocks:", "blocks:x", "blocks:-1", "blocks:9999999"}) {
    CAPTURE(bad);
    TrainConfig c = tiny(data, 2);
    c.train.recompute = bad;
    CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("'train.recompute' must be"), Error);
  }
}
