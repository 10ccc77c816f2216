#include "tapeformer/train/hooks/spalm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/layers/spalm.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/evaluator.h"
#include "tapeformer/core/program_name.h"
#include "tapeformer/train/knn.h"
#include "tapeformer/train/windows.h"

namespace tapeformer {
namespace fs = std::filesystem;
namespace {

// The fewest positions a store must share with a split to count as its text.
constexpr int64_t kSameTextMin = 32;

std::vector<int32_t> read_all(const TokenSource& tokens) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens.size()));
  if (!ids.empty()) tokens.read(0, tokens.size(), ids.data());
  return ids;
}

// The offset o at which the store's values are the split's next tokens
// (values[o + p] = tokens[p + 1] over every position both hold), or -1.
int64_t same_text_offset(const Datastore& store, const std::vector<int32_t>& tokens, int64_t train_length) {
  const std::vector<int32_t>& values = store.values();
  const auto n = static_cast<int64_t>(tokens.size()) - 1, N = store.size();  // positions with a next token
  for (const int64_t o : {int64_t{0}, train_length}) {
    const int64_t shared = std::min(n, N - o);
    if (shared < std::min(n, kSameTextMin) || shared <= 0) continue;
    bool same = true;
    for (int64_t p = 0; p < shared && same; ++p) same = values[static_cast<size_t>(o + p)] == tokens[static_cast<size_t>(p + 1)];
    if (same) return o;
  }
  return -1;
}

// Every model.* key but the kind's own (and dropout) must agree, or the
// retriever's weights mean something else in the SPALM model.
void check_same_architecture(const ModelConfig& run, const TrainConfig& retriever) {
  TrainConfig mine;
  mine.model = run;
  const auto architecture = [](const TrainConfig& c) {
    std::map<std::string, std::string> out;
    for (const auto& [key, value] : c.fields())
      if (key.rfind("model.", 0) == 0 && key != "model.arch" && key != "model.dropout" &&
          key.rfind("model.spalm_", 0) != 0)
        out[key] = value;
    return out;
  };
  const auto a = architecture(mine), b = architecture(retriever);
  for (const auto& [key, value] : a) {
    const auto it = b.find(key);
    const std::string theirs = it == b.end() ? "(unset)" : it->second;
    TAPEFORMER_CHECK(theirs == value, "model.spalm_init: the retriever's ", key, " is ", theirs, ", this run's ",
                     value, ": start from scratch (model.spalm_init false) or give the same model");
  }
}

}  // namespace

SpalmRetriever::~SpalmRetriever() = default;

SpalmRetriever::SpalmRetriever(const TrainConfig& cfg, const Tokenizer& tokenizer)
    : k_(cfg.model.option_int("spalm_k")) {
  const std::string store_path = cfg.model.option_string("spalm_store"),
                    checkpoint = cfg.model.option_string("spalm_retriever");
  TAPEFORMER_CHECK(!store_path.empty(), "model.spalm_store is required with model.arch \"spalm\": the kNN store its "
                   "tokens are retrieved from (", program_name(), " knn build --checkpoint RETRIEVER --data TEXT --out STORE)");
  TAPEFORMER_CHECK(!checkpoint.empty(), "model.spalm_retriever is required with model.arch \"spalm\": the checkpoint "
                   "of the frozen model model.spalm_store ('", store_path, "') was built from, which computes the "
                   "queries");
  store_path_ = store_path;
  try {
    retriever_ = std::make_unique<Loaded>(load_model(checkpoint));
  } catch (const Error& e) {
    fail("model.spalm_retriever '", checkpoint, "': ", e.what());
  }
  TAPEFORMER_CHECK(dynamic_cast<const SpalmLM*>(retriever_->model.get()) == nullptr, "model.spalm_retriever '", checkpoint,
                   "' is itself a SPALM model: the retriever must be the plain model the store was built from");
  TAPEFORMER_CHECK(tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(*retriever_->tokenizer),
                   "model.spalm_retriever '", checkpoint, "' has another tokenizer than this run (", 
                   retriever_->tokenizer->vocab_size(), " tokens, this run's ", tokenizer.vocab_size(),
                   "): the retrieved tokens would be another vocabulary's");
  KnnOptions opt;
  opt.store = store_path;
  opt.k = 1;
  opt.nprobe = cfg.model.option_int("spalm_nprobe");
  TAPEFORMER_CHECK(opt.nprobe >= 0, "model.spalm_nprobe must be >= 0, got ", opt.nprobe);
  nprobe_ = opt.nprobe;
  try {
    store_ = std::make_unique<Datastore>(open_knn_store(opt, retriever_->cfg, *retriever_->model, *retriever_->tokenizer));
  } catch (const Error& e) {
    fail("model.spalm_store (with model.spalm_retriever '", checkpoint, "'): ", e.what());
  }
  if (cfg.model.option_bool("spalm_init")) check_same_architecture(cfg.model, retriever_->cfg);
  TAPEFORMER_CHECK(k_ + 1 <= store_->size(), "model.spalm_k = ", k_, " needs ", k_ + 1,
                   " keys (a position's own entry may be left out), but the store '", store_path, "' holds ",
                   store_->size());
  retriever_->model->eval();
}

SpalmTable SpalmRetriever::table(const std::vector<int32_t>& tokens, int64_t train_length,
                                 const std::string& what) const {
  const LanguageModel& model = *retriever_->model;
  const TrainConfig& rc = retriever_->cfg;
  const int64_t C = rc.model.n_embd, K = k_, n = static_cast<int64_t>(tokens.size());
  SpalmTable table;
  table.n = n;
  table.k = K;
  table.ids.assign(static_cast<size_t>(n * K), -1);
  if (n < 2) return table;
  const int64_t self = same_text_offset(*store_, tokens, train_length);
  if (!what.empty())
    std::fprintf(stderr, "spalm: retrieving %lld tokens for each of the %lld positions of the %s from '%s'%s\n",
                 static_cast<long long>(K), static_cast<long long>(n), what.c_str(), store_path_.c_str(),
                 self >= 0 ? ", each position's own entry left out" : "");
  const int64_t shared = self < 0 ? 0 : std::min(n - 1, store_->size() - self);
  const std::vector<int32_t>& values = store_->values();

  // The retriever's context vectors as `knn build` computes its keys, so
  // that on the store's own text a position's query is its own key.
  std::vector<float> queries;  // (block, C)
  std::vector<int64_t> positions;
  const auto search = [&] {
    const auto q = static_cast<int64_t>(positions.size());
    if (q == 0) return;
    const Neighbours nb = store_->index().search(queries.data(), q, K + 1);  // (q, K + 1)
    for (int64_t i = 0; i < q; ++i) {
      const int64_t p = positions[static_cast<size_t>(i)];
      const int64_t own = self >= 0 && p < shared ? self + p : -1;
      int32_t* row = table.ids.data() + p * K;
      int64_t kept = 0;
      for (int64_t j = 0; j <= K && kept < K; ++j) {
        const int64_t id = nb.ids[static_cast<size_t>(i * (K + 1) + j)];
        if (id < 0) continue;
        if (id == own) {
          ++table.excluded;
          continue;
        }
        row[kept++] = values[static_cast<size_t>(id)];
      }
    }
    queries.clear();
    positions.clear();
  };
  EvalText text;
  text.ids = tokens;
  Evaluator(model).read_text(text, rc.model.block_size, rc.eval.mem_len, /*features=*/true,
                             [&](const Window& w, const Var& features) {
    const Tensor f = features.value().contiguous();  // (1, W, C)
    for (int64_t t = 0; t < w.len; ++t) {
      const float* row = f.data() + (w.again + t) * C;
      TAPEFORMER_CHECK(std::isfinite(row[0]), "model.spalm_retriever: its context vector at position ", w.start + t,
                       " is not finite: the weights are not usable");
      queries.insert(queries.end(), row, row + C);
      positions.push_back(w.start + t);
    }
    if (static_cast<int64_t>(positions.size()) >= 1024) search();
  });
  search();
  if (!what.empty() && self >= 0)
    std::fprintf(stderr, "spalm: %lld of the %lld positions found their own entry among %lld neighbours (left out)\n",
                 static_cast<long long>(table.excluded), static_cast<long long>(shared), static_cast<long long>(K + 1));
  return table;
}

namespace {

constexpr char kTableMagic[9] = "TFSPALMT";
constexpr uint32_t kTableVersion = 1;
// Payload: key u64, n i64, k i64, excluded i64, then ids (n k int32).
constexpr uint64_t kTableHeaderBytes = 4 * 8;

template <typename T>
uint64_t hash_value(const T& v, uint64_t h) {
  return fnv1a64(reinterpret_cast<const char*>(&v), sizeof(v), h);
}

}  // namespace

SpalmTable SpalmRetriever::cached_table(const std::vector<int32_t>& tokens, int64_t train_length,
                                        const std::string& what, const std::string& path) const {
  // What the table depends on: the retriever's weights, the store file, K, nprobe and the text.
  uint64_t key = hash_value(model_fingerprint(retriever_->cfg, *retriever_->model), kFnvOffset);
  std::error_code ec;
  const auto bytes = static_cast<int64_t>(fs::file_size(store_path_, ec));
  const auto mtime = static_cast<int64_t>(fs::last_write_time(store_path_, ec).time_since_epoch().count());
  const std::string where = fs::absolute(store_path_, ec).string();
  key = fnv1a64(where.data(), where.size(), key);
  for (const int64_t v : {bytes, mtime, k_, nprobe_, train_length, static_cast<int64_t>(tokens.size())})
    key = hash_value(v, key);
  key = fnv1a64(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t), key);
  if (fs::exists(path, ec)) {
    try {
      CheckedFile f = open_checked_file(path, kTableMagic, kTableVersion, "SPALM table");
      uint64_t stored = 0;
      SpalmTable t;
      f.in->read(reinterpret_cast<char*>(&stored), sizeof(stored));
      f.in->read(reinterpret_cast<char*>(&t.n), sizeof(t.n));
      f.in->read(reinterpret_cast<char*>(&t.k), sizeof(t.k));
      f.in->read(reinterpret_cast<char*>(&t.excluded), sizeof(t.excluded));
      if (*f.in && stored == key && t.n == static_cast<int64_t>(tokens.size()) && t.k == k_ &&
          f.length == kTableHeaderBytes + static_cast<uint64_t>(t.n * t.k) * sizeof(int32_t)) {
        t.ids.resize(static_cast<size_t>(t.n * t.k));
        f.in->read(reinterpret_cast<char*>(t.ids.data()), static_cast<std::streamsize>(t.ids.size() * sizeof(int32_t)));
        if (*f.in) {
          t.cached = true;
          t.key = key;
          if (!what.empty())
            std::fprintf(stderr, "spalm: the %s's retrieved tokens from '%s'\n", what.c_str(), path.c_str());
          return t;
        }
      }
      std::fprintf(stderr, "spalm: '%s' was made for another retriever, store or text: retrieving again\n",
                   path.c_str());
    } catch (const Error& e) {
      std::fprintf(stderr, "spalm: %s: retrieving again\n", e.what());
    }
  }
  SpalmTable t = table(tokens, train_length, what);
  t.key = key;
  return t;
}

void SpalmRetriever::keep_table(const SpalmTable& t, const std::string& path) {
  write_checked_file(path, kTableMagic, kTableVersion, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(&t.key), sizeof(t.key));
    out.write(reinterpret_cast<const char*>(&t.n), sizeof(t.n));
    out.write(reinterpret_cast<const char*>(&t.k), sizeof(t.k));
    out.write(reinterpret_cast<const char*>(&t.excluded), sizeof(t.excluded));
    out.write(reinterpret_cast<const char*>(t.ids.data()), static_cast<std::streamsize>(t.ids.size() * sizeof(int32_t)));
  });
}

namespace {

class SpalmSampler : public TokenRetriever {
 public:
  SpalmSampler(const LanguageModel& model, const Datastore& store, int64_t k, int64_t context)
      : model_(model), store_(store), k_(k), state_(model.make_state(1, context)) {}

  IndexTensor retrieve(const IndexTensor& ids, bool restart) override {
    if (restart) state_->reset();
    NoGradGuard no_grad;
    ModelContext ctx;
    ctx.state = state_.get();
    ctx.features = true;
    const Tensor f = model_.forward(ids, ctx).value().contiguous();  // (1, T, C): the queries
    const int64_t T = ids.shape[1], K = k_;
    const Neighbours nb = store_.index().search(f.data(), T, K);  // (T, K)
    return IndexTensor({1, T, K}, neighbour_values(nb, store_));  // -1 where the search found fewer
  }

 private:
  const LanguageModel& model_;
  const Datastore& store_;
  int64_t k_;
  std::unique_ptr<InferenceState> state_;
};

}  // namespace

std::unique_ptr<TokenRetriever> SpalmRetriever::sampler(int64_t context) const {
  return std::make_unique<SpalmSampler>(*retriever_->model, *store_, k_, context);
}

void SpalmRetriever::initialise(LanguageModel& model) const {
  auto* spalm = dynamic_cast<SpalmLM*>(&model);
  TAPEFORMER_CHECK(spalm != nullptr, "SpalmRetriever::initialise: not a SPALM model (model.arch \"",
                   model.config().arch, "\")");
  check_same_architecture(model.config(), retriever_->cfg);
  spalm->lm->load_state(retriever_->model->state());
}

Batch RetrievingSource::next() {
  Batch b = inner_.next();
  const int64_t B = b.inputs.shape[0], T = b.inputs.shape[1], K = table_.k;
  TAPEFORMER_CHECK(static_cast<int64_t>(b.starts.size()) == B, "RetrievingSource: the batch source does not give its "
                   "rows' start positions (Batch::starts)");
  std::vector<int32_t> ids(static_cast<size_t>(B * T * K));
  for (int64_t r = 0; r < B; ++r) {
    const int64_t s = b.starts[static_cast<size_t>(r)];
    TAPEFORMER_CHECK(s >= 0 && s + T <= table_.n, "RetrievingSource: row ", r, " starts at ", s,
                     ", outside the table's ", table_.n, " positions");
    std::copy_n(table_.ids.begin() + s * K, T * K, ids.begin() + r * T * K);
  }
  b.extra[kRetrieved] = IndexTensor({B, T, K}, std::move(ids));
  return b;
}

SpalmData::SpalmData(const TrainConfig& cfg, const Tokenizer& tokenizer, const TokenSource& train,
                     const TokenSource& val, const std::string& run_dir)
    : retriever(std::make_unique<SpalmRetriever>(cfg, tokenizer)) {
  train_table = retriever->cached_table(read_all(train), train.size(), "train split", train_path(run_dir));
  val_table = retriever->cached_table(read_all(val), train.size(), "val split", val_path(run_dir));
}

std::string SpalmData::train_path(const std::string& run_dir) { return run_dir + "/spalm_train.table"; }
std::string SpalmData::val_path(const std::string& run_dir) { return run_dir + "/spalm_val.table"; }

std::vector<KeptFile> SpalmData::kept_files(const std::string& run_dir) const {
  // A table read back from the run's directory is not written again.
  const auto writer = [](const SpalmTable& table, const std::string& path) {
    return std::function<void()>([&table, path] {
      if (!table.cached) SpalmRetriever::keep_table(table, path);
    });
  };
  return {{train_path(run_dir), writer(train_table, train_path(run_dir))},
          {val_path(run_dir), writer(val_table, val_path(run_dir))}};
}

namespace {

// SPALM's hooks: training reads the tables of both splits (SpalmData), a
// text read window by window gets its own table, and sampling searches the
// store for each fed position through the retriever's own state.
class SpalmHooks : public ModelHooks {
 public:
  explicit SpalmHooks(const HookSite& site) : site_(site) {
    TAPEFORMER_CHECK(site.task.empty(), site.task, ": model.arch \"", site.cfg->model.arch,
                     "\" retrieves from a text's kNN store; it trains on a text corpus, not on a task");
    if (site.train != nullptr && site.val != nullptr)
      data_ = std::make_unique<SpalmData>(*site.cfg, *site.tokenizer, *site.train, *site.val, site.run_dir);
    if (site.context > 0) {  // sampling: the retriever and its store, opened and checked before anything is drawn
      retriever_ = std::make_unique<SpalmRetriever>(*site.cfg, *site.tokenizer);
      sampler_ = retriever_->sampler(site.context);
    }
  }

  BatchSource* batches(BatchSource& inner, bool eval) override {
    TAPEFORMER_CHECK(data_ != nullptr, "SPALM: training and its evaluations need the train and val splits' tables");
    (eval ? val_source_ : train_source_) =
        std::make_unique<RetrievingSource>(inner, eval ? data_->val_table : data_->train_table);
    return (eval ? val_source_ : train_source_).get();
  }
  std::vector<KeptFile> kept_files(const std::string& run_dir) const override {
    return data_ ? data_->kept_files(run_dir) : std::vector<KeptFile>();
  }

  void begin_text(const EvalText& text) override {
    // The val split of a store of the whole file starts after the train split's tokens.
    const int64_t train_length =
        text.split == "val"
            ? static_cast<int64_t>(read_eval_text(text.path, *site_.tokenizer, "train", text.val_fraction).ids.size())
            : 0;
    table_ = SpalmRetriever(*site_.cfg, *site_.tokenizer).table(text.ids, train_length, "text");
  }
  void window_inputs(const Window& w, ModelInputs& inputs) const override {
    const int64_t W = w.ids.shape[1], K = table_.k, first = w.start - w.again;  // the window's rows of the table
    inputs[kRetrieved] = IndexTensor({1, W, K}, std::vector<int32_t>(table_.ids.begin() + first * K,
                                                                     table_.ids.begin() + (first + W) * K));
  }

  void sample_inputs(const IndexTensor& ids, bool restart, ModelInputs& inputs) override {
    TAPEFORMER_CHECK(sampler_ != nullptr, "SPALM: sampling needs hooks made for it (HookSite::context)");
    inputs[kRetrieved] = sampler_->retrieve(ids, restart);
  }

  std::string refuses_mixture() const override {
    return "model.arch \"" + site_.cfg->model.arch + "\" retrieves from its own store (model.spalm_store)";
  }

 private:
  HookSite site_;
  std::unique_ptr<SpalmData> data_;
  std::unique_ptr<RetrievingSource> train_source_, val_source_;
  SpalmTable table_;  // a text's (begin_text)
  std::unique_ptr<SpalmRetriever> retriever_;
  std::unique_ptr<TokenRetriever> sampler_;
};

}  // namespace

ModelHooksKind spalm_model_hooks() {
  return {"spalm", "the tokens SPALM's frozen retriever finds in its store for every position",
          [](const HookSite& site) -> std::unique_ptr<ModelHooks> { return std::make_unique<SpalmHooks>(site); },
          [](const HookSite& site, LanguageModel& model) {  // a fresh SPALM starts as its retriever
            if (site.cfg->model.option_bool("spalm_init")) SpalmRetriever(*site.cfg, *site.tokenizer).initialise(model);
          }};
}

}  // namespace tapeformer
