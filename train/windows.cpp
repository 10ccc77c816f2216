#include "tapeformer/train/windows.h"

#include <algorithm>

#include "tapeformer/core/error.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/data/utf8.h"

namespace tapeformer {

EvalText read_eval_text(const std::string& path, const Tokenizer& tokenizer, const std::string& split,
                        double val_fraction) {
  TAPEFORMER_CHECK(split == "all" || split == "train" || split == "val", "--split must be all, train or val, got \"",
                   split, "\"");
  std::string text = read_corpus_file(path, tokenizer.kind());
  const bool characters = tokenizer_kinds().get(tokenizer.kind()).text;
  if (split != "all") {
    const size_t at = split_offset(text, val_fraction, characters, "data file '" + path + "'");
    text = split == "train" ? text.substr(0, at) : text.substr(at);
  }
  EvalText out;
  try {
    out.ids = tokenizer.encode(text);
  } catch (const Error& e) {
    fail("data file '", path, "': ", e.what());
  }
  TAPEFORMER_CHECK(out.ids.size() >= 2, "data file '", path, "'", split == "all" ? "" : " (" + split + " split)",
                   " has fewer than 2 tokens");
  out.characters = std::max<int64_t>(1, count_characters(text));
  out.path = path;
  out.split = split;
  out.val_fraction = val_fraction;
  return out;
}

int64_t whole_windows(int64_t n, int64_t T, int64_t stride) {
  TAPEFORMER_CHECK(T >= 1 && stride >= 1, "windows: length and stride must be >= 1, got ", T, " and ", stride);
  return n >= T + 1 ? (n - T - 1) / stride + 1 : 0;
}

int64_t count_windows(int64_t n, int64_t T, int64_t align) {
  TAPEFORMER_CHECK(T >= 1, "windows: length must be >= 1, got ", T);
  if (align > 1) return whole_windows(n, T, align);
  return n >= 2 ? (n - 2) / T + 1 : 0;  // starts 0, T, 2T, ... with a token after
}

void for_each_window(const std::vector<int32_t>& ids, int64_t T, int64_t ext_len,
                     const std::function<void(const Window&)>& fn, int64_t align) {
  TAPEFORMER_CHECK(T >= 1, "windows: length must be >= 1, got ", T);
  TAPEFORMER_CHECK(align >= 1, "windows: data.align must be >= 1, got ", align);
  TAPEFORMER_CHECK(align == 1 || ext_len == 0, "windows: data.align ", align, " reads records, not a stream with ext_len ",
                   ext_len);
  const int64_t n = static_cast<int64_t>(ids.size());
  if (align > 1) {
    // Records: exactly the windows training draws from (whole windows of T
    // starting at multiples of align), each read once.
    TAPEFORMER_CHECK(n >= T + 1, "windows: data.align ", align, " reads whole windows of ", T + 1, " tokens, but the "
                     "text has ", n);
    const int64_t windows = count_windows(n, T, align);
    for (int64_t k = 0, start = 0; k < windows; ++k, start += align) {
      Window w;
      w.len = T;
      w.start = start;
      w.ids = IndexTensor({1, T}, std::vector<int32_t>(ids.begin() + start, ids.begin() + start + T));
      w.targets = IndexTensor({1, T}, std::vector<int32_t>(ids.begin() + start + 1, ids.begin() + start + T + 1));
      fn(w);
    }
    return;
  }
  const int64_t windows = count_windows(n, T, 1);
  for (int64_t k = 0, start = 0; k < windows; ++k, start += T) {
    Window w;
    w.len = std::min(T, n - 1 - start);
    w.again = std::min(ext_len, start);
    w.start = start;
    w.ids = IndexTensor({1, w.again + w.len},
                        std::vector<int32_t>(ids.begin() + start - w.again, ids.begin() + start + w.len));
    std::vector<int32_t> targets(static_cast<size_t>(w.again), kIgnoreTarget);
    targets.insert(targets.end(), ids.begin() + start + 1, ids.begin() + start + w.len + 1);
    w.targets = IndexTensor({1, w.again + w.len}, std::move(targets));
    fn(w);
  }
}

}  // namespace tapeformer
