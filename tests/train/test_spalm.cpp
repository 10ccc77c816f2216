// SPALM's retrieval and training (train/hooks/spalm.h): a position's own store
// entry left out on the store's text (and only there), the gate closed
// giving the retriever's eval loss bit for bit, resume bit-exact with the
// retrieved tokens in every batch, and the refusals of the model.spalm_* keys.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "expect_error.h"
#include "fresh_checkpoint.h"
#include "tapeformer/layers/spalm.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/knn.h"
#include "tapeformer/train/sample.h"
#include "tapeformer/train/hooks/spalm.h"
#include "tapeformer/train/trainer.h"
#include "temp_dir.h"

using namespace tapeformer;

namespace {

// Letters and spaces drawn at random: no two contexts alike, so a key's
// nearest neighbour is itself alone.
std::string random_text(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::string s;
  for (int64_t i = 0; i < n; ++i) s += "abcdefgh ."[rng.below(10)];
  return s;
}

std::string write_text(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = (dir.path / name).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The retriever's model: a Transformer-XL (segment memory of 8).
ModelConfig xl_model(int64_t vocab, int64_t n_embd = 12) {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = n_embd;
  m.block_size = 16;
  m.vocab_size = vocab;
  m.positional = "txl";
  m.options["mem_len"] = int64_t{8};
  return m;
}

// A checkpoint of a freshly initialised model of `model` over `text`'s characters.
std::string make_checkpoint(const TempDir& dir, const std::string& name, const std::string& text, uint64_t seed,
                            const std::function<void(ModelConfig&)>& adjust = {}) {
  CharTokenizer tok(text);
  TrainConfig cfg;
  cfg.model = xl_model(tok.vocab_size());
  if (adjust) adjust(cfg.model);
  return save_fresh_checkpoint(dir, name, cfg, tok, seed);
}

std::string build_store(const std::string& checkpoint, const std::string& data, const std::string& split,
                        const std::string& out) {
  KnnBuildArgs b;
  b.checkpoint = checkpoint;
  b.data = data;
  b.split = split;
  b.out = out;
  b.index.kind = "exact";
  build_knn_store(b);
  return out;
}

// A SPALM run's config over `data` retrieving K tokens from `store` of `retriever`.
TrainConfig spalm_run(const std::string& data, const std::string& retriever, const std::string& store, int64_t k,
                      int64_t vocab) {
  TrainConfig c;
  c.model = xl_model(vocab);
  c.model.arch = "spalm";
  c.model.options["spalm_k"] = k;
  c.model.options["spalm_retriever"] = retriever;
  c.model.options["spalm_store"] = store;
  c.data.path = data;
  c.train.batch_size = 4;
  c.train.shards = 2;
  c.train.seed = 3;
  c.optimizer.lr = 0.01;
  c.schedule.name = "constant";
  c.eval.interval = 10;
  c.eval.iters = 1;
  c.eval.final_iters = 1;
  c.checkpoint.interval = 20;
  c.log.interval = 5;
  return c;
}

struct Fixture {
  TempDir dir{"spalm"};
  std::string text = random_text(1400, 1);
  std::string data = write_text(dir, "data.txt", text);
  CharTokenizer tok{text};
  std::string retriever = make_checkpoint(dir, "xl", text, 7);
  std::string train_store = build_store(retriever, data, "train", (dir.path / "train.knn").string());
};

std::vector<int32_t> split_ids(const Fixture& f, const std::string& split) {
  return read_eval_text(f.data, f.tok, split, 0.1).ids;
}

}  // namespace

TEST_CASE("SPALM retrieval: a position's own entry is left out on the store's text, and only there") {
  Fixture f;
  const std::vector<int32_t> train = split_ids(f, "train"), val = split_ids(f, "val");
  const auto n_train = static_cast<int64_t>(train.size()), n_val = static_cast<int64_t>(val.size());
  for (const int64_t k : {int64_t{1}, int64_t{4}}) {
    CAPTURE(k);
    const TrainConfig cfg = spalm_run(f.data, f.retriever, f.train_store, k, f.tok.vocab_size());
    const SpalmRetriever r(cfg, f.tok);
    const SpalmTable t = r.table(train, n_train);
    CHECK(t.n == n_train);
    CHECK(t.excluded == n_train - 1);  // every position with a next token found itself, and lost it
    // Without the exclusion the nearest value would be the target itself at
    // every position (the leak); with it, the answer comes back only by chance.
    int64_t answer = 0;
    for (int64_t p = 0; p + 1 < n_train; ++p) answer += t.ids[static_cast<size_t>(p * k)] == train[static_cast<size_t>(p + 1)];
    CHECK(answer < (n_train - 1) / 3);
    for (int64_t i = 0; i < (n_train - 1) * k; ++i) CHECK(t.ids[static_cast<size_t>(i)] >= 0);
    // The last position has no next token, hence no key: nothing to leave out.
    // The val split is another text: nothing is left out.
    const SpalmTable v = r.table(val, n_train);
    CHECK(v.excluded == 0);
  }
  // A store of the whole file holds the val split after the train split.
  const std::string all = build_store(f.retriever, f.data, "all", (f.dir.path / "all.knn").string());
  const SpalmRetriever r(spalm_run(f.data, f.retriever, all, 2, f.tok.vocab_size()), f.tok);
  CHECK(r.table(train, n_train).excluded == n_train - 1);
  // The val split read alone has other contexts than inside the whole file,
  // so its queries are near, not equal to, its own keys: those found are left
  // out, and the answer comes back only by chance.
  const SpalmTable v = r.table(val, n_train);
  CHECK(v.excluded > 0);
  int64_t answer = 0;
  for (int64_t p = 0; p + 1 < n_val; ++p) answer += v.ids[static_cast<size_t>(p * 2)] == val[static_cast<size_t>(p + 1)];
  CHECK(answer < (n_val - 1) / 3);
}

TEST_CASE("SPALM with its gate closed evaluates to its retriever's loss bit for bit") {
  Fixture f;
  const TrainConfig run = spalm_run(f.data, f.retriever, f.train_store, 3, f.tok.vocab_size());
  Rng rng(0);
  SpalmLM spalm(run.model, rng);
  spalm.lm->load_state(load_checkpoint(f.retriever).model);
  spalm.gate->bias.value().copy_from(Tensor::full({1}, 100.0f));  // sigmoid(100) rounds to 1: g = 1
  Checkpoint c;
  c.config_json = run.to_json();
  c.tokenizer = save_tokenizer(f.tok);
  c.model = spalm.state();
  const std::string path = (f.dir.path / "spalm.bin").string();
  save_checkpoint(path, c);
  for (const std::string split : {"val", "train"}) {
    CAPTURE(split);
    EvalArgs a;
    a.data = f.data;
    a.split = split;
    a.checkpoint = f.retriever;
    const EvalResult xl = evaluate_file(a);
    a.checkpoint = path;
    const EvalResult sp = evaluate_file(a);
    CHECK(sp.tokens == xl.tokens);
    CHECK(sp.loss == xl.loss);
  }
  // The gate open: the retrieved tokens count.
  spalm.gate->bias.value().copy_from(Tensor::full({1}, 0.0f));
  c.model = spalm.state();
  save_checkpoint(path, c);
  EvalArgs a;
  a.data = f.data;
  a.split = "val";
  a.checkpoint = f.retriever;
  const double xl = evaluate_file(a).loss;
  a.checkpoint = path;
  CHECK(evaluate_file(a).loss != xl);
}

TEST_CASE("SPALM training: starts from the retriever, resumes bit for bit") {
  Fixture f;
  const auto config = [&](int64_t steps) {
    TrainConfig c = spalm_run(f.data, f.retriever, f.train_store, 3, f.tok.vocab_size());
    c.train.max_iters = steps;
    return c;
  };
  {
    Trainer t(config(1), (f.dir.path / "init").string());
    // Before any step the transformer is the retriever's.
    const Checkpoint xl = load_checkpoint(f.retriever);
    const NamedTensors mine = t.model().state();
    int64_t same = 0;
    for (const auto& [name, value] : xl.model)
      for (const auto& [n2, v2] : mine)
        if (n2 == name) same += value.to_vector() == v2.to_vector();
    CHECK(same == static_cast<int64_t>(xl.model.size()));
  }
  TrainResult straight;
  {
    Trainer t(config(40), (f.dir.path / "straight").string());
    straight = t.run();
  }
  {
    Trainer t(config(20), (f.dir.path / "split").string());
    t.run();
  }
  auto t = Trainer::resume((f.dir.path / "split").string(), [](TrainConfig& c) { c.train.max_iters = 40; });
  const TrainResult resumed = t->run();
  CHECK(resumed.steps == 40);
  CHECK(resumed.train_loss == straight.train_loss);
  CHECK(resumed.val_loss == straight.val_loss);
  CHECK(std::isfinite(straight.val_loss));
}

TEST_CASE("SPALM tables: kept in a file and read back only while nothing they depend on changed") {
  Fixture f;
  const TrainConfig run = spalm_run(f.data, f.retriever, f.train_store, 3, f.tok.vocab_size());
  const SpalmRetriever r(run, f.tok);
  const std::vector<int32_t> train = split_ids(f, "train"), val = split_ids(f, "val");
  const auto len = static_cast<int64_t>(train.size());
  const std::string path = (f.dir.path / "t.table").string();
  const SpalmTable a = r.cached_table(train, len, "", path);
  CHECK_FALSE(a.cached);
  CHECK_FALSE(std::filesystem::exists(path));  // cached_table reads; keep_table writes
  SpalmRetriever::keep_table(a, path);
  const SpalmTable b = r.cached_table(train, len, "", path);
  CHECK(b.cached);
  CHECK(b.n == a.n);
  CHECK(b.k == a.k);
  CHECK(b.excluded == a.excluded);
  CHECK(b.ids == a.ids);
  // Another text: searched again, not read back.
  const SpalmTable c = r.cached_table(val, len, "", path);
  CHECK_FALSE(c.cached);
  CHECK(c.ids == r.table(val, len).ids);
  SpalmRetriever::keep_table(c, path);
  CHECK(r.cached_table(val, len, "", path).cached);
  // A corrupt file: searched again, no error.
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-1, std::ios::end);
    file.put('\x7f');
  }
  const SpalmTable d = r.cached_table(val, len, "", path);
  CHECK_FALSE(d.cached);
  CHECK(d.ids == c.ids);
  SpalmRetriever::keep_table(d, path);
  CHECK(r.cached_table(val, len, "", path).cached);
  // The store rewritten (its modification time moves): stale.
  std::filesystem::last_write_time(f.train_store,
                                   std::filesystem::last_write_time(f.train_store) + std::chrono::hours(1));
  const SpalmRetriever again(run, f.tok);
  CHECK_FALSE(again.cached_table(val, len, "", path).cached);
}

TEST_CASE("SPALM sampling: its retriever's tokens with the gate closed; each token's neighbours as eval reads them") {
  Fixture f;
  const TrainConfig run = spalm_run(f.data, f.retriever, f.train_store, 3, f.tok.vocab_size());
  Rng init(0);
  SpalmLM spalm(run.model, init);
  const Loaded xl = load_model(f.retriever);
  spalm.lm->load_state(xl.model->state());
  const SpalmRetriever retriever(run, f.tok);
  const std::vector<int32_t> prompt = f.tok.encode("abc d");
  SampleOptions opt;
  opt.tokens = 11;  // 16 positions in all: one window, so eval's first window sees what sampling saw
  opt.temperature = 0.9f;
  opt.seed = 5;

  // Gate closed (g = 1): the XL's logits bit for bit, so the same draws.
  spalm.gate->bias.value().copy_from(Tensor::full({1}, 100.0f));
  {
    Rng a(opt.seed), b(opt.seed);
    HookSite site;  // SPALM's own hooks, as `sample` makes them
    site.cfg = &run;
    site.tokenizer = &f.tok;
    site.context = 16;
    const std::unique_ptr<ModelHooks> hooks = make_model_hooks(site);
    CHECK(generate(spalm, prompt, opt, a, {}, {hooks.get()}) == generate(*xl.model, prompt, opt, b));
  }

  // Gate open, greedy: every draw is the argmax of the full forward over the
  // text with the neighbours eval's table gives each position.
  spalm.gate->bias.value().copy_from(Tensor::full({1}, 0.0f));
  struct Recording : TokenRetriever {
    std::unique_ptr<TokenRetriever> inner;
    std::vector<int32_t> seen;  // every retrieved id, in order
    IndexTensor retrieve(const IndexTensor& ids, bool restart) override {
      IndexTensor r = inner->retrieve(ids, restart);
      seen.insert(seen.end(), r.data.begin(), r.data.end());
      return r;
    }
  } rec;
  rec.inner = retriever.sampler(16);
  struct RecordingHooks : ModelHooks {  // the recording retriever's tokens as the model's extra input
    TokenRetriever* retriever = nullptr;
    void sample_inputs(const IndexTensor& ids, bool restart, ModelInputs& inputs) override {
      inputs[SpalmLM::kRetrieved] = retriever->retrieve(ids, restart);
    }
  } hooks;
  hooks.retriever = &rec;
  opt.temperature = 0.0f;
  Rng rng(opt.seed);
  const std::vector<int32_t> seq = generate(spalm, prompt, opt, rng, {}, {&hooks});
  REQUIRE(seq.size() == 16);
  const int64_t K = 3, T = 15;  // the last token is never fed
  const SpalmTable table = retriever.table(seq, 0);
  CHECK(table.excluded == 0);
  CHECK(rec.seen == std::vector<int32_t>(table.ids.begin(), table.ids.begin() + T * K));
  const IndexTensor ids({1, T}, std::vector<int32_t>(seq.begin(), seq.begin() + T));
  const IndexTensor near({1, T, K}, std::vector<int32_t>(table.ids.begin(), table.ids.begin() + T * K));
  spalm.eval();
  NoGradGuard no_grad;
  const ModelInputs inputs{{SpalmLM::kRetrieved, near}};
  ModelContext ctx;
  ctx.inputs = &inputs;
  const Tensor logits = spalm.forward(ids, ctx).value();  // (1, T, V)
  const int64_t V = f.tok.vocab_size();
  for (int64_t t = static_cast<int64_t>(prompt.size()) - 1; t < T; ++t) {
    CAPTURE(t);
    const float* row = logits.data() + t * V;
    CHECK(std::max_element(row, row + V) - row == seq[static_cast<size_t>(t + 1)]);
  }
  // A model that reads retrieved tokens is refused without its hooks.
  Rng again(opt.seed);
  expect_error([&] { generate(spalm, prompt, opt, again); }, {"\"spalm\"", "retrieved tokens"});
}

TEST_CASE("SPALM refuses: no store or retriever, another model's store, another vocabulary, K too large") {
  Fixture f;
  const int64_t V = f.tok.vocab_size();
  const auto build = [&](const TrainConfig& c) { SpalmRetriever r(c, f.tok); };
  TrainConfig c = spalm_run(f.data, f.retriever, f.train_store, 2, V);
  c.model.options.erase("spalm_store");
  expect_error([&] { build(c); }, {"model.spalm_store is required", "knn build"});
  c = spalm_run(f.data, f.retriever, f.train_store, 2, V);
  c.model.options.erase("spalm_retriever");
  expect_error([&] { build(c); }, {"model.spalm_retriever is required"});
  c = spalm_run(f.data, (f.dir.path / "missing").string(), f.train_store, 2, V);
  expect_error([&] { build(c); }, {"model.spalm_retriever '", "missing"});
  // Another seed: other weights than the store's.
  const std::string other = make_checkpoint(f.dir, "other", f.text, 8);
  expect_error([&] { build(spalm_run(f.data, other, f.train_store, 2, V)); },
               {"model.spalm_store", "another model or other weights"});
  // A retriever over another text has another vocabulary than the run.
  const std::string text2 = f.text + "XYZ";
  const std::string foreign = make_checkpoint(f.dir, "foreign", text2, 7);
  expect_error([&] { build(spalm_run(f.data, foreign, f.train_store, 2, V)); }, {"another tokenizer than this run"});
  const int64_t keys = Datastore::load(f.train_store).size();
  expect_error([&] { build(spalm_run(f.data, f.retriever, f.train_store, keys, V)); },
               {"model.spalm_k = " + std::to_string(keys), "holds " + std::to_string(keys)});
  // Starting from the retriever's weights needs its architecture.
  c = spalm_run(f.data, f.retriever, f.train_store, 2, V);
  c.model.n_layer = 3;
  c.train.max_iters = 1;
  expect_error([&] { Trainer t(c, (f.dir.path / "wide").string()); }, {"model.spalm_init", "model.n_layer"});
  c = spalm_run(f.data, f.retriever, f.train_store, 2, V);
  c.model.options["spalm_nprobe"] = int64_t{-1};
  expect_error([&] { build(c); }, {"model.spalm_nprobe must be >= 0"});
}

TEST_CASE("RetrievingSource: each row's retrieved tokens are the table's rows at its positions, ext_len included") {
  std::vector<int32_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 7);
  SpalmTable table;
  table.n = 200;
  table.k = 2;
  for (int64_t p = 0; p < table.n * table.k; ++p) table.ids.push_back(static_cast<int32_t>(p));  // row p: 2p, 2p + 1
  StreamSampler streams(tokens, /*batch=*/3, /*block=*/8, "test", /*ext=*/4);
  RetrievingSource source(streams, table);
  for (int step = 0; step < 12; ++step) {  // past a restart of the streams
    const Batch b = source.next();
    const int64_t B = b.inputs.shape[0], T = b.inputs.shape[1];
    REQUIRE(b.extra.count(SpalmLM::kRetrieved) == 1);
    const IndexTensor& retrieved = b.extra.at(SpalmLM::kRetrieved);
    REQUIRE(retrieved.shape == Shape({B, T, 2}));
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t p = b.starts[static_cast<size_t>(r)] + t;
        CHECK(b.inputs.data[static_cast<size_t>(r * T + t)] == tokens[static_cast<size_t>(p)]);
        CHECK(retrieved.data[static_cast<size_t>((r * T + t) * 2)] == 2 * p);
        CHECK(retrieved.data[static_cast<size_t>((r * T + t) * 2 + 1)] == 2 * p + 1);
      }
  }
  // A source that does not say where its rows start is refused.
  struct Anonymous : BatchSource {
    Batch next() override { return {IndexTensor({1, 2}, {0, 1}), IndexTensor({1, 2}, {1, 2}), {}, {}}; }
    void save_position(cereal::BinaryOutputArchive&) const override {}
    void load_position(cereal::BinaryInputArchive&) override {}
  } anonymous;
  RetrievingSource bad(anonymous, table);
  expect_error([&] { bad.next(); }, {"Batch::starts"});
}
