#include "tapeformer/train/stream_state.h"

#include <cereal/types/vector.hpp>

#include "tapeformer/core/error.h"
#include "tapeformer/core/serialize.h"

namespace tapeformer {

void StreamState::save_group(cereal::BinaryOutputArchive& ar, const std::vector<Tensor>& all) {
  ar(static_cast<uint64_t>(all.size()));
  for (const Tensor& t : all) {
    const std::vector<float> v = t.defined() ? t.to_vector() : std::vector<float>();
    ar(static_cast<int64_t>(t.defined() ? t.dim(1) : 0), v);
  }
}

std::vector<Tensor> StreamState::load_group(cereal::BinaryInputArchive& ar, const MemoryGroupSpec& g) const {
  const char* what = g.what.c_str();
  const size_t n = read_count(ar, static_cast<uint64_t>(g.tensors), what);
  TAPEFORMER_CHECK(n == 0 || n == static_cast<size_t>(g.tensors), what, ": ", n, " tensors where the model has ",
                   g.tensors);
  std::vector<Tensor> out;
  for (size_t l = 0; l < n; ++l) {
    int64_t m = 0;
    ar(m);
    TAPEFORMER_CHECK(m >= 0 && m <= g.max_rows, what, ": ", m, " positions, more than the ", g.max_rows, " kept");
    std::vector<float> v;
    read_bounded(ar, v, static_cast<uint64_t>(batch * m * g.width), what);
    TAPEFORMER_CHECK(static_cast<int64_t>(v.size()) == batch * m * g.width, what, ": ", v.size(), " values for (",
                     batch, ", ", m, ", ", g.width, ")");
    out.push_back(Tensor::from({batch, m, g.width}, v));
  }
  return out;
}

}  // namespace tapeformer
