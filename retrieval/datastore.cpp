#include "tapeformer/retrieval/datastore.h"

#include <cerrno>
#include <cstring>
#include <istream>
#include <ostream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/retrieval/bounded_reader.h"

namespace tapeformer {
namespace {

constexpr char kStoreMagic[9] = "TFKNNDS1";

template <class T>
void put(std::ostream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

Datastore::Datastore(DatastoreInfo info, const IndexOptions& index)
    : info_(std::move(info)), index_(info_.dim, index) {
  TAPEFORMER_CHECK(info_.vocab_size >= 1 && info_.vocab_size <= INT32_MAX, "kNN store: vocab size must be in [1, ",
                   INT32_MAX, "], got ", info_.vocab_size);
}

void Datastore::add(const float* keys, const int32_t* values, int64_t n) {
  TAPEFORMER_CHECK(!finished_, "kNN store: add after finish()");
  TAPEFORMER_CHECK(n >= 0, "kNN store: add of ", n, " pairs");
  for (int64_t i = 0; i < n; ++i)
    TAPEFORMER_CHECK(values[i] >= 0 && values[i] < info_.vocab_size, "kNN store: value ", values[i],
                     " is outside the vocabulary of ", info_.vocab_size);
  pending_.insert(pending_.end(), keys, keys + n * info_.dim);
  values_.insert(values_.end(), values, values + n);
}

void Datastore::finish() {
  TAPEFORMER_CHECK(!finished_, "kNN store: finish() twice");
  TAPEFORMER_CHECK(!values_.empty(), "kNN store: no keys to index (the text gave no positions)");
  index_.add(pending_.data(), size());
  std::vector<float>().swap(pending_);  // the index holds its own copy
  finished_ = true;
}

void Datastore::save(const std::string& path) const {
  TAPEFORMER_CHECK(finished_, "kNN store: save before finish()");
  // Every failure names the store: a write error inside FAISS's serialisation
  // would otherwise surface as FAISS's own text ("index_write.cpp:401 ...").
  const std::string what = "cannot write the kNN store '" + path + "'";
  int write_error = 0;  // errno of the file's failed write, when that is what went wrong
  try {
    write_checked_file(path, kStoreMagic, kVersion, [&](std::ostream& out) {
      const auto* sink = dynamic_cast<const FileSink*>(out.rdbuf());
      try {
        put<uint64_t>(out, info_.model_fingerprint);
        put<uint64_t>(out, info_.tokenizer_fingerprint);
        put<int64_t>(out, info_.vocab_size);
        put<int64_t>(out, info_.dim);
        put<int64_t>(out, size());
        put<uint64_t>(out, info_.source.size());
        out.write(info_.source.data(), static_cast<std::streamsize>(info_.source.size()));
        out.write(reinterpret_cast<const char*>(values_.data()),
                  static_cast<std::streamsize>(values_.size() * sizeof(int32_t)));
        index_.write(out);
        out.flush();  // a failed write of the last buffer shows here, with its errno
      } catch (const Error&) {
        if (sink != nullptr) write_error = sink->error();
        throw;
      }
      if (sink != nullptr) write_error = sink->error();
      TAPEFORMER_CHECK(write_error == 0 && out.good(), "the write failed");
    });
  } catch (const Error& e) {
    switch (write_error) {
      case 0: fail(what, ": ", e.what());
      case EFBIG: fail(what, ": file too large (ulimit -f?)");
      case ENOSPC: fail(what, ": no space left on device");
      case EDQUOT: fail(what, ": disk quota exceeded");
      default: fail(what, ": ", std::strerror(write_error));
    }
  }
}

Datastore Datastore::load(const std::string& path) {
  const std::string origin = "kNN store '" + path + "'";
  CheckedFile f = open_checked_file(path, kStoreMagic, kVersion, "kNN store");
  BoundedReader p{*f.in, f.length, origin, "cannot decode"};  // the payload, front to back
  DatastoreInfo info;
  info.model_fingerprint = p.get<uint64_t>("the model fingerprint");
  info.tokenizer_fingerprint = p.get<uint64_t>("the tokenizer fingerprint");
  info.vocab_size = p.get<int64_t>("the vocabulary size");
  info.dim = p.get<int64_t>("the key width");
  const auto count = p.get<int64_t>("the count");
  const auto source_bytes = p.get<uint64_t>("the source");
  TAPEFORMER_CHECK(info.vocab_size >= 1 && info.vocab_size <= INT32_MAX && info.dim >= 1 &&
                       info.dim <= (int64_t{1} << 20),
                   origin, ": cannot decode (vocabulary size ", info.vocab_size, ", key width ", info.dim, ")");
  // Each pair takes 4 C + 4 bytes at least (its key in the index, its value).
  TAPEFORMER_CHECK(count >= 1 && static_cast<uint64_t>(count) <= p.left / (4 * static_cast<uint64_t>(info.dim) + 4),
                   origin, ": cannot decode (a count of ", count, " pairs for ", p.left, " bytes)");
  TAPEFORMER_CHECK(source_bytes <= 4096, origin, ": cannot decode (a source of ", source_bytes, " bytes)");
  info.source.resize(source_bytes);
  p.bytes(info.source.data(), source_bytes, "the source");
  std::vector<int32_t> values(static_cast<size_t>(count));
  p.bytes(values.data(), values.size() * sizeof(int32_t), "the values");
  for (size_t i = 0; i < values.size(); ++i)
    TAPEFORMER_CHECK(values[i] >= 0 && values[i] < info.vocab_size, origin, ": value ", values[i], " at ", i,
                     " is outside the vocabulary of ", info.vocab_size);
  VectorIndex index = VectorIndex::read(p.in, p.left, origin);
  TAPEFORMER_CHECK(index.size() == count && index.dim() == info.dim, origin, ": the index holds ", index.size(),
                   " keys of width ", index.dim(), " for ", count, " values of width ", info.dim);
  Datastore store(std::move(info), index.options());
  store.index_ = std::move(index);
  store.values_ = std::move(values);
  store.finished_ = true;
  return store;
}

}  // namespace tapeformer
