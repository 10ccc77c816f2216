// Training SPALM (layers/spalm.h; Yogatama et al. 2021): where its
// retrieved tokens come from.
//
//   tapeformer knn build --checkpoint XL_RUN --data input.txt --split train --out xl.knn
//   tapeformer train configs/spalm.json --set model.spalm_retriever=XL_RUN --set model.spalm_store=xl.knn
//   tapeformer sample --checkpoint SPALM_RUN      (the same retriever and store, searched per token)
//
// The long-term memory is a kNN-LM datastore (train/knn.h) of (context
// vector, next token) pairs built by a pretrained model, the retriever
// (model.spalm_retriever), which stays frozen: as in the paper, neither its
// keys nor its queries are trained with SPALM. The retriever reads each
// split as `knn build` and `eval` read a text (train/windows.h: windows of
// its block size, one stream, its segment memory carried), and its context
// vector at position p is the query; the K nearest keys' values (next
// tokens) are what position p retrieves. Since the retriever is frozen they
// depend on the position alone, so they are computed once per split when
// the run is built (SpalmTable; kept in the run's directory, so a resume
// reads them back) and looked up for each batch by the rows' start
// positions (RetrievingSource), which keeps training, resuming and
// data-parallel shards as they are for any model.
//
// Leaving the answer out: when the store holds the very text a split is
// (built from it, or from the whole file it was cut from), position p's own
// entry has the target x_{p+1} as its value, and retrieving it would teach
// the model to copy. Such a store is recognised by its values: at offset o
// (0, or the train split's length for a store of the whole file) they are
// the split's next tokens, x_{p+1} = values[o + p], over the positions both
// hold (at least 32 of them, or all). Then entry o + p is left out of
// position p's neighbours (K + 1 are searched, so K remain). A store of
// another text excludes nothing.
//
// Checks, each an Error naming the model.spalm_* key or the file: no
// store or retriever given, a retriever that is not a checkpoint, a store
// of another model or vocabulary than the retriever (open_knn_store), a
// retriever with another tokenizer than the run, K + 1 more than the
// store's keys, and with model.spalm_init a retriever whose model.* differs
// from the run's (but for model.arch, model.dropout and model.spalm_*),
// all before the (minutes-long, on a large text) retrieval starts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/data/sampler.h"
#include "tapeformer/data/token_file.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/layers/spalm.h"
#include "tapeformer/retrieval/datastore.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/model_hooks.h"
#include "tapeformer/train/sample.h"

namespace tapeformer {

struct Loaded;  // train/load_model.h

// The tokens a model that reads retrieved tokens gets beside each position
// while sampling (SPALM's hooks use one). It is passed every token fed, in
// order, once; `restart` says the model's state was just reset and `ids` is
// the window read afresh.
class TokenRetriever {
 public:
  virtual ~TokenRetriever() = default;
  // ids (1, T) -> retrieved (1, T, K), -1 where fewer were found.
  virtual IndexTensor retrieve(const IndexTensor& ids, bool restart) = 0;
};

// K retrieved tokens for every position of a split: ids (N, K), -1 where
// the search found fewer.
struct SpalmTable {
  int64_t n = 0, k = 0;
  std::vector<int32_t> ids;
  int64_t excluded = 0;  // positions whose own store entry was left out
  bool cached = false;   // read from a cache file (SpalmRetriever::cached_table)
  uint64_t key = 0;      // cached_table's: what the table was computed from
};

// The frozen retriever and its store, opened and checked for a SPALM run.
class SpalmRetriever {
 public:
  // cfg: the SPALM run's config (model.arch "spalm"); tokenizer: the run's.
  SpalmRetriever(const TrainConfig& cfg, const Tokenizer& tokenizer);
  ~SpalmRetriever();

  // The table of a split's tokens. train_length: the train split's tokens
  // (the offset of the val split in a store of the whole file). With `what`
  // ("val split") a line on stderr says what is being retrieved.
  SpalmTable table(const std::vector<int32_t>& tokens, int64_t train_length, const std::string& what = "") const;
  // The same, read back from the file `path` when keep_table wrote it from
  // the same retriever weights, store file (path, size and modification
  // time), K, nprobe, tokens and train_length; else (missing, stale,
  // corrupt: said on stderr) computed. A run keeps its tables in its
  // directory, so a resume does not search again.
  SpalmTable cached_table(const std::vector<int32_t>& tokens, int64_t train_length, const std::string& what,
                          const std::string& path) const;
  // Writes a cached_table's result to `path` (checked, atomically).
  static void keep_table(const SpalmTable& table, const std::string& path);
  // A fresh run's starting weights (model.spalm_init): the retriever's
  // weights copied into `model`'s tensors of the same names.
  void initialise(LanguageModel& model) const;
  // Sampling's retrieval (train/sample.h): the retriever reads the tokens
  // generate() feeds through its own state of `context` positions, and each
  // position gets the values of its query's K nearest keys (nothing left
  // out: a generated text is not the store's).
  std::unique_ptr<TokenRetriever> sampler(int64_t context) const;
  const Datastore& store() const { return *store_; }
  int64_t k() const { return k_; }

 private:
  std::unique_ptr<Loaded> retriever_;
  std::unique_ptr<Datastore> store_;
  int64_t k_, nprobe_;
  std::string store_path_;
};

// The name of SPALM's extra input (ModelInputs, Batch::extra): the retrieved
// tokens (B, T, K).
inline constexpr const char* kRetrieved = SpalmLM::kRetrieved;

// A batch source that adds the retrieved tokens to another's batches:
// batch.extra["retrieved"] (B, T, K) = table rows starts[b] + t. The inner source
// must fill Batch::starts (window_batch does); its position is this one's.
class RetrievingSource : public BatchSource {
 public:
  RetrievingSource(BatchSource& inner, const SpalmTable& table) : inner_(inner), table_(table) {}
  Batch next() override;
  bool restarted() const override { return inner_.restarted(); }
  void save_position(cereal::BinaryOutputArchive& ar) const override { inner_.save_position(ar); }
  void load_position(cereal::BinaryInputArchive& ar) override { inner_.load_position(ar); }

 private:
  BatchSource& inner_;
  const SpalmTable& table_;
};

// All of a SPALM run's retrieval: the retriever and the train and val
// tables (SPALM's training hooks).
struct SpalmData {
  // The tables are read from run_dir (spalm_train.table, spalm_val.table)
  // where an earlier run kept them, else computed.
  SpalmData(const TrainConfig& cfg, const Tokenizer& tokenizer, const TokenSource& train, const TokenSource& val,
            const std::string& run_dir);
  // The two tables' files in run_dir, each written (by the Trainer's rank 0,
  // once the run's directory exists) when it was computed, not read.
  std::vector<KeptFile> kept_files(const std::string& run_dir) const;
  static std::string train_path(const std::string& run_dir);
  static std::string val_path(const std::string& run_dir);
  std::unique_ptr<SpalmRetriever> retriever;
  SpalmTable train_table, val_table;
};

}  // namespace tapeformer
