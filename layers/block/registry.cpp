// The table of block kinds.
#include "tapeformer/layers/block/block.h"

#include <algorithm>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"

namespace tapeformer {

// Each kind's entry, defined in its own file.
BlockKind standard_block_kind();    // standard.cpp
BlockKind reversible_block_kind();  // reversible.cpp
BlockKind post_ln_block_kind();     // post_ln.cpp
BlockKind gtrxl_block_kind();       // gtrxl.cpp

Registry<BlockKind>& block_kinds() {
  static Registry<BlockKind> kinds("model.block", {standard_block_kind(), reversible_block_kind(), post_ln_block_kind(),
                                                 gtrxl_block_kind()});
  return kinds;
}

Var BlockStack::forward(const Var&, SegmentMemory&, Rng&) const {
  fail("this block stack keeps no segment memory (model.mem_len needs model.block \"standard\", \"post_ln\" or "
       "\"gtrxl\")");
}

Tensor next_memory(const Tensor& old, const Var& x, int64_t mem_len) {
  const Tensor cat = old.defined() && old.dim(1) > 0 ? concat({Var(old), detach(x)}, 1).value() : x.value();
  const int64_t n = cat.dim(1), keep = std::min(n, mem_len);
  return cat.slice(1, n - keep, n).contiguous();  // (B, keep, C)
}

MemoryCompression MemoryCompression::of(const ModelConfig& cfg) {
  MemoryCompression c;
  for (const ModelOption& o : block_kinds().get(cfg.block).options)
    if (o.name == "cmem_len") c = {cfg.option_int("cmem_len"), cfg.option_int("cmem_ratio"), cfg.option_string("cmem_fn")};
  return c;
}

Tensor compress_rows(const Tensor& rows_in, const MemoryCompression& c) {
  const Tensor rows = rows_in.contiguous();
  const int64_t B = rows.dim(0), n = rows.dim(1), C = rows.dim(2), r = c.ratio, out_n = n / r, skip = n - out_n * r;
  Tensor out = Tensor::empty({B, out_n, C});
  const bool max = c.fn == "max";
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k = 0; k < out_n; ++k) {
      const Scalar* in = rows.data() + (b * n + skip + k * r) * C;
      Scalar* o = out.data() + (b * out_n + k) * C;
      for (int64_t j = 0; j < C; ++j) o[j] = in[j];
      for (int64_t i = 1; i < r; ++i)
        for (int64_t j = 0; j < C; ++j) o[j] = max ? std::max(o[j], in[i * C + j]) : o[j] + in[i * C + j];
      if (!max)
        for (int64_t j = 0; j < C; ++j) o[j] /= static_cast<Scalar>(r);
    }
  }
  return out;
}

Tensor attended_memory(const Tensor& memory, const Tensor& compressed) {
  if (!compressed.defined() || compressed.dim(1) == 0) return memory;
  if (!memory.defined() || memory.dim(1) == 0) return compressed;
  return concat({Var(compressed), Var(memory)}, 1).value();
}

void update_memory(Tensor& memory, Tensor& compressed, const Var& x, int64_t mem_len, const MemoryCompression& c) {
  const Tensor old = memory;
  memory = next_memory(old, x, mem_len);
  if (c.len <= 0) return;
  const int64_t before = old.defined() ? old.dim(1) : 0, fell_out = before + x.dim(1) - memory.dim(1);
  if (fell_out <= 0) return;
  // The rows that fell out are the oldest of [old; x].
  const Tensor all = before > 0 ? concat({Var(old), detach(x)}, 1).value() : x.value();
  const Tensor pooled = compress_rows(all.slice(1, 0, fell_out), c);
  if (pooled.dim(1) == 0) return;
  const Tensor grown = attended_memory(pooled, compressed);  // [compressed; pooled]
  const int64_t m = grown.dim(1), kept = std::min(m, c.len);
  compressed = grown.slice(1, m - kept, m).contiguous();
}

}  // namespace tapeformer
