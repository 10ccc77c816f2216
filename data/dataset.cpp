#include "tapeformer/core/program_name.h"
#include "tapeformer/data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/data/nanogpt_meta.h"

namespace tapeformer {
namespace fs = std::filesystem;

TrainingData load_training_data(const std::string& path, const TokenizerOptions& options, double val_fraction,
                                int64_t vocab_size, std::unique_ptr<Tokenizer> tok) {
  TrainingData d;
  TAPEFORMER_CHECK(!path.empty(), "no data file: set data.path in the config or pass --data FILE");
  const fs::path dir(path);
  if (fs::is_directory(dir)) {
    // Token files (tapeformer prepare, nanoGPT's layout): read window by window, never whole.
    const std::string what = "data directory '" + path + "'";
    TAPEFORMER_CHECK(fs::exists(dir / "train.bin") && fs::exists(dir / "val.bin"), what,
                     " has no train.bin and val.bin (write them with: ", program_name(), " prepare --data FILE --out DIR)");
    if (!tok && !fs::exists(dir / "tokenizer.bin") && fs::exists(dir / "meta.pkl")) {
      tok = read_nanogpt_meta((dir / "meta.pkl").string());  // nanoGPT's char-level data directory
    } else if (!tok) {
      check_regular_file((dir / "tokenizer.bin").string(), "tokenizer file");
      std::ifstream in(dir / "tokenizer.bin", std::ios::binary);
      TAPEFORMER_CHECK(in.good(), what,
                       " has no tokenizer.bin (", program_name(), " prepare writes one) or meta.pkl (nanoGPT's char-level "
                       "prepare.py writes one)");
      std::stringstream bytes;
      bytes << in.rdbuf();
      try {
        tok = load_tokenizer(bytes.str());
      } catch (const Error& e) {
        fail("tokenizer file '", (dir / "tokenizer.bin").string(), "' is truncated or damaged (", e.what(),
             "); write the token files again with: ", program_name(), " prepare --data FILE --out ", path);
      }
    }
    TAPEFORMER_CHECK(tok->kind() == options.kind, "data.tokenizer is \"", options.kind, "\" but ",
                     what, " was prepared with the \"", tok->kind(), "\" tokenizer (set data.tokenizer=",
                     tok->kind(), ", or prepare the files again)");
    TAPEFORMER_CHECK(vocab_size == 0 || vocab_size == tok->vocab_size(), "data.vocab_size is ",
                     vocab_size, " but ", what, " was prepared with a vocabulary of ", tok->vocab_size());
    d.tokenizer = std::move(tok);
    auto train_file = std::make_unique<TokenFile>((dir / "train.bin").string());
    auto val_file = std::make_unique<TokenFile>((dir / "val.bin").string());
    for (const TokenFile* f : {train_file.get(), val_file.get()})
      TAPEFORMER_CHECK(f->max_id() < d.tokenizer->vocab_size(), what, ": an id of ", f->max_id(),
                       " in its token files, beyond the tokenizer's ", d.tokenizer->vocab_size());
    d.train = std::move(train_file);
    d.val = std::move(val_file);
    d.val_tokens_per_char = static_cast<double>(d.val->size()) /
                            static_cast<double>(std::max<int64_t>(1, count_characters(*d.val, *d.tokenizer)));
  } else try {
    // A byte-level run takes any non-empty file; the others valid UTF-8 text.
    const std::string kind = tok ? tok->kind() : options.kind;
    const std::string text = read_corpus_file(path, kind);
    const std::string origin = "data file '" + path + "'";
    if (!tok) {
      const size_t at = split_offset(text, val_fraction, tokenizer_kinds().get(kind).text, origin);
      tok = build_tokenizer(options,
                            CorpusText::of(text, std::string_view(text).substr(0, at), origin));
    }
    d.tokenizer = std::move(tok);
    d.corpus = std::make_unique<TextCorpus>(text, *d.tokenizer, val_fraction, origin);
    d.train = std::make_unique<VectorTokens>(d.corpus->train());
    d.val = std::make_unique<VectorTokens>(d.corpus->val());
    d.val_tokens_per_char =
        static_cast<double>(d.corpus->val().size()) / static_cast<double>(d.corpus->val_characters());
  } catch (const std::bad_alloc&) {
    // The corpus, not the model, is what did not fit: the model is built later.
    std::error_code ec;
    const auto bytes = fs::file_size(path, ec);
    fail("out of memory reading data file '", path, "' (", ec ? 0 : bytes >> 20,
         " MiB) into memory as text and token ids (about 5 bytes per character); ", prepare_advice(path));
  }
  return d;
}

}  // namespace tapeformer
