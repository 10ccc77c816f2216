#include "tapeformer/train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cereal/archives/binary.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <streambuf>
#include <type_traits>

#include "tapeformer/core/error.h"
#include "tapeformer/core/serialize.h"
#include "tapeformer/optim/optimizer.h"

namespace tapeformer {
namespace {

constexpr char kMagic[8] = {'T', 'F', 'C', 'K', 'P', 'T', '0', '1'};
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 8;

// Tensors travel as (name, dims, values): the one serialisation pattern for
// tensor maps (model state, optimizer state).
struct TensorRecord {
  std::string name;
  std::vector<int64_t> dims;
  std::vector<float> values;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(name, dims, values);
  }
};

// Decodes the payload that save_checkpoint's cereal archive wrote, field by
// field in the same layout (cereal's binary format: a u64 count before every
// string and vector), reading the caller's string in place. Every count is
// checked against the bytes left before anything is allocated
// (core/serialize.h).
class PayloadReader {
 public:
  explicit PayloadReader(const std::string& payload) : buf_(payload), in_(&buf_), ar_(in_) {}

  template <class T>
  void read(T& value) {  // fixed-size fields only: strings and vectors go through a count check
    static_assert(std::is_arithmetic_v<T> || std::is_same_v<T, Rng>, "read(): a fixed-size field");
    ar_(value);
  }
  void read(std::string& s, const char* what) { read_bounded(ar_, s, bytes_left(), what); }
  template <class T>
  void read(std::vector<T>& v, const char* what) {
    read_bounded(ar_, v, bytes_left() / sizeof(T), what);
  }
  void read(std::vector<TensorRecord>& records, const char* what) {
    // A record is three counts at least.
    records.resize(read_count(ar_, bytes_left() / (3 * sizeof(cereal::size_type)), what));
    for (TensorRecord& r : records) {
      read(r.name, "a tensor name");
      read(r.dims, "a tensor shape");
      read(r.values, "tensor values");
    }
  }
  size_t bytes_left() const { return buf_.left(); }

 private:
  struct View : std::streambuf {  // reads a string in place (istringstream would copy it)
    explicit View(const std::string& s) {
      char* p = const_cast<char*>(s.data());  // only read: no put area is set
      setg(p, p, p + s.size());
    }
    size_t left() const { return static_cast<size_t>(egptr() - gptr()); }
  };
  View buf_;
  std::istream in_;
  cereal::BinaryInputArchive ar_;
};

NamedTensors from_records(const std::vector<TensorRecord>& records, const std::string& path) {
  NamedTensors out;
  for (const auto& r : records) {
    Shape s;
    int64_t n = -1;
    try {  // Shape checks the rank, numel the product
      s = Shape(r.dims);
      if (std::all_of(r.dims.begin(), r.dims.end(), [](int64_t d) { return d >= 0; })) n = s.numel();
    } catch (const Error& e) {
      fail("checkpoint '", path, "': tensor '", r.name, "': ", e.what());
    }
    TAPEFORMER_CHECK(n == static_cast<int64_t>(r.values.size()), "checkpoint '", path, "': tensor '", r.name, "' has ",
                     r.values.size(), " values for shape ", s);
    out.emplace_back(r.name, Tensor::from(s, r.values));
  }
  return out;
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
T get(const std::string& in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

// Magic, version, payload length and checksum.
std::string checkpoint_header(uint64_t length, uint64_t checksum) {
  std::string header(kMagic, sizeof kMagic);
  put<uint32_t>(header, kCheckpointVersion);
  put<uint64_t>(header, length);
  put<uint64_t>(header, checksum);
  return header;
}

// A model's or optimizer's tensors in the payload, written from the tensors
// themselves: the layout of a std::vector<TensorRecord> in a cereal binary
// archive (a count, then each record's name, dims and values), with no copy
// of the values.
struct TensorsOut {
  const NamedTensors& tensors;
  template <class Archive>
  void save(Archive& ar) const {
    ar(cereal::make_size_tag(static_cast<cereal::size_type>(tensors.size())));
    for (const auto& [name, t] : tensors) {
      const Tensor c = t.contiguous();  // a view of t when it is contiguous already
      ar(name, c.shape().to_vector());
      ar(cereal::make_size_tag(static_cast<cereal::size_type>(c.numel())));
      ar(cereal::binary_data(c.data(), static_cast<size_t>(c.numel()) * sizeof(Scalar)));
    }
  }
};

}  // namespace

std::string checkpoint_file_bytes(const std::string& payload) {
  return checkpoint_header(payload.size(), fnv1a64(payload)) + payload;
}

// The payload streams into the file as cereal writes it (no copy of the
// weights in memory: a checkpoint of a large model would otherwise be held
// several times over while it is written); the header's length and checksum
// are written over their placeholder once the payload is through.
void save_checkpoint(const std::string& path, const Checkpoint& c) {
  write_atomic(path, [&](int fd, FileSink& sink) {
    const std::string placeholder(kHeaderBytes, '\0');
    sink.sputn(placeholder.data(), static_cast<std::streamsize>(placeholder.size()));
    TAPEFORMER_CHECK(sink.start_payload(), "writing '", path, "' failed: ", std::strerror(sink.error()));
    std::ostream out(&sink);
    try {
      cereal::BinaryOutputArchive ar(out);
      Rng rng = c.rng;
      ar(c.config_json, c.tokenizer, TensorsOut{c.model}, TensorsOut{c.optimizer}, c.optimizer_step, c.step,
         c.train_seconds, rng, c.sampler, c.train_loss, static_cast<uint8_t>(c.eval_pending));
    } catch (const cereal::Exception&) {  // the sink refused bytes: say why, not how many
      fail("writing '", path, "' failed: ", std::strerror(sink.error() != 0 ? sink.error() : EIO));
    }
    TAPEFORMER_CHECK(sink.flush(), "writing '", path, "' failed: ", std::strerror(sink.error()));
    const std::string header = checkpoint_header(sink.count(), sink.hash());
    TAPEFORMER_CHECK(::pwrite(fd, header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()),
                     "writing '", path, "' failed: ", std::strerror(errno));
  });
}

Checkpoint load_checkpoint(const std::string& path) {
  check_regular_file(path, "checkpoint");
  std::ifstream in(path, std::ios::binary);
  TAPEFORMER_CHECK(in.good(), "checkpoint '", path, "': cannot open (", std::strerror(errno), ")");
  // The header first, so any other file is refused without reading it whole.
  std::string header(kHeaderBytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(kHeaderBytes));
  TAPEFORMER_CHECK(in.gcount() == static_cast<std::streamsize>(kHeaderBytes) &&
                       std::memcmp(header.data(), kMagic, sizeof kMagic) == 0,
                   "checkpoint '", path, "': not a tapeformer checkpoint (bad header)");
  const uint32_t version = get<uint32_t>(header, 8);
  TAPEFORMER_CHECK(version >= 1 && version <= kCheckpointVersion, "checkpoint '", path, "': format version ",
                   version, " is not supported (this build reads versions 1 to ", kCheckpointVersion, ")");
  const uint64_t length = get<uint64_t>(header, 12), checksum = get<uint64_t>(header, 20);
  std::string payload;  // the rest of the file, read once into its final place
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(static_cast<std::streamoff>(kHeaderBytes));
  TAPEFORMER_CHECK(end >= static_cast<std::streamoff>(kHeaderBytes) && in.good(), "checkpoint '", path,
                   "': cannot read (not a regular file?)");
  payload.resize(static_cast<size_t>(end) - kHeaderBytes);
  in.read(payload.data(), static_cast<std::streamsize>(payload.size()));
  TAPEFORMER_CHECK(in.gcount() == static_cast<std::streamsize>(payload.size()), "checkpoint '", path,
                   "': read ", in.gcount(), " of ", payload.size(), " bytes");
  TAPEFORMER_CHECK(payload.size() >= length, "checkpoint '", path, "': truncated (", payload.size(), " of ", length,
                   " payload bytes)");
  TAPEFORMER_CHECK(payload.size() == length, "checkpoint '", path, "': corrupted (", payload.size() - length,
                   " bytes after the ", length, "-byte payload)");
  TAPEFORMER_CHECK(fnv1a64(payload) == checksum, "checkpoint '", path, "': corrupted (checksum mismatch)");

  Checkpoint c;
  c.version = version;
  c.checksum = checksum;
  std::vector<TensorRecord> model, optimizer;
  try {  // the order of save_checkpoint's ar(...)
    PayloadReader r(payload);
    r.read(c.config_json, "the config");
    r.read(c.tokenizer, "the tokenizer");
    r.read(model, "the model tensors");
    r.read(optimizer, "the optimizer tensors");
    r.read(c.optimizer_step);
    r.read(c.step);
    r.read(c.train_seconds);
    r.read(c.rng);
    r.read(c.sampler, "the sampler state");
    if (version >= 2) r.read(c.train_loss);
    if (version >= 3) {
      uint8_t pending = 0;
      r.read(pending);
      TAPEFORMER_CHECK(pending <= 1, "the evaluation-pending flag is ", int(pending), ", not 0 or 1");
      c.eval_pending = pending == 1;
    }
    TAPEFORMER_CHECK(r.bytes_left() == 0, "stray bytes after the last field: ", r.bytes_left());
  } catch (const std::runtime_error& e) {  // cereal's short reads and the checks here, not bad_alloc
    fail("checkpoint '", path, "': cannot decode payload (", e.what(), ")");
  }
  c.model = from_records(model, path);
  c.optimizer = from_records(optimizer, path);
  // Counters a resumed run loops on, and its clock: in range, as a run writes them.
  TAPEFORMER_CHECK(c.step >= 0 && c.step <= kMaxOptimizerSteps && c.optimizer_step >= 0 &&
                       c.optimizer_step <= kMaxOptimizerSteps,
                   "checkpoint '", path, "': step ", c.step, " / optimizer step ", c.optimizer_step,
                   " outside [0, 2^24]");
  TAPEFORMER_CHECK(std::isfinite(c.train_seconds) && c.train_seconds >= 0, "checkpoint '", path,
                   "': training time ", c.train_seconds, " s is not a finite duration");
  TAPEFORMER_CHECK(version == 1 || c.step == 0 || std::isfinite(c.train_loss), "checkpoint '", path,
                   "': the loss of step ", c.step, " is ", c.train_loss, " (a checkpoint holds a finite one)");
  return c;
}

}  // namespace tapeformer
