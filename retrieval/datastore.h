// Datastore: the kNN-LM memory (Khandelwal et al. 2020): a key for every
// position of a text (the model's context vector there, (C)) and its value
// (the token that followed, an id), with a VectorIndex over the keys.
//
//   Datastore store(DatastoreInfo{model_fp, tokenizer_fp, V, C, "train.txt"}, IndexOptions{"ivf"});
//   store.add(keys, values, n);        // keys (n, C), values (n): as many calls as needed
//   store.finish();                    // builds the index (ivf learns its cells here)
//   store.save("shakespeare.knn");     // atomic
//   Datastore again = Datastore::load("shakespeare.knn");
//   Neighbours nb = again.index().search(queries, 16);   // nb.ids index values()
//
// The store knows nothing of models: it carries the fingerprints of the
// model and tokenizer the keys came from (train/knn.h computes and checks
// them), the vocabulary size and width, and where the keys came from.
//
// File (core/files.h's checked layout, magic "TFKNNDS1", version 1): magic,
// version, payload length, FNV-1a 64 of the payload, then the payload:
//   model fingerprint u64, tokenizer fingerprint u64, vocab size i64,
//   dim C i64, count N i64, source (u64 length + bytes),
//   values (N int32),
//   the index (VectorIndex::write: its kind and options, then FAISS's own
//   serialisation, which holds the N keys as float32 and the ivf cells or
//   hnsw graph), to the end of the file.
// The keys are stored once, inside the FAISS index, so a store is about
// N (4C + 4) bytes (+ the hnsw graph's links), and loading rebuilds nothing.
// Loading refuses, each with an Error naming the file: another kind of file,
// a newer format, a truncated file, a checksum mismatch, counts or values
// out of range, an index whose size or width differs from the header, and
// a FAISS index forged behind a valid checksum (VectorIndex::read: a size
// beyond the file, hnsw links or levels out of range, ivf ids outside the
// store, a NaN or infinite key). Saving names the store when a write fails
// ("cannot write the kNN store 'PATH': file too large (ulimit -f?)").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/retrieval/vector_index.h"

namespace tapeformer {

struct DatastoreInfo {
  uint64_t model_fingerprint = 0;      // of the model the keys came from
  uint64_t tokenizer_fingerprint = 0;  // of its tokenizer: the values' vocabulary
  int64_t vocab_size = 0;              // V: values are in [0, V)
  int64_t dim = 0;                     // C: keys are (C)
  std::string source;                  // what the keys were read from (for people)
};

class Datastore {
 public:
  static constexpr uint32_t kVersion = 1;

  // An empty store of keys (info.dim) and values in [0, info.vocab_size).
  Datastore(DatastoreInfo info, const IndexOptions& index);

  // Appends n pairs: keys (n, C) row-major, values (n). Refused after finish().
  void add(const float* keys, const int32_t* values, int64_t n);
  // Builds the index over every key added (once); then the store is searchable.
  void finish();
  bool finished() const { return finished_; }

  int64_t size() const { return static_cast<int64_t>(values_.size()); }
  const DatastoreInfo& info() const { return info_; }
  const VectorIndex& index() const { return index_; }
  VectorIndex& index() { return index_; }  // set_search_options
  const std::vector<int32_t>& values() const { return values_; }  // (N), by index id

  // Writes the finished store atomically (temp file, fsync, rename).
  void save(const std::string& path) const;
  // Refuses a FIFO or device, a missing file, another kind of file, a
  // truncated or corrupted one (see above), naming `path`.
  static Datastore load(const std::string& path);

 private:
  DatastoreInfo info_;
  std::vector<float> pending_;  // keys added before finish(), (N, C)
  std::vector<int32_t> values_;
  VectorIndex index_;
  bool finished_ = false;
};

}  // namespace tapeformer
