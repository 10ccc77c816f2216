// data/sentencepiece.h: learnt subword vocabularies, lossless round trips,
// the split and token files with subwords, persistence, errors; StreamDecoder.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/sentencepiece.h"
#include "tapeformer/data/token_file.h"
#include "tapeformer/data/tokenizer.h"
#include "temp_dir.h"

using namespace tapeformer;
using doctest::Contains;
namespace fs = std::filesystem;

namespace {

// About 60 KB of lines of words drawn from a small list: enough repetition
// for subwords to be worth learning, ASCII only (so "☃" is unseen).
std::string word_text() {
  static const char* words[] = {"the",   "king",  "queen", "shall", "speak", "hear",  "me",     "citizen",
                                "rome",  "first", "good",  "lord",  "thou",  "art",   "noble",  "and",
                                "death", "sweet", "night", "day",   "what",  "must",  "before", "proceed"};
  Rng rng(11);
  std::string text;
  while (text.size() < 60000) {
    const uint64_t n = 3 + rng.below(8);
    for (uint64_t i = 0; i < n; ++i) {
      if (i > 0) text += rng.below(10) == 0 ? "  " : " ";  // some runs of spaces, which must survive
      std::string w = words[rng.below(24)];
      if (i == 0) w[0] = static_cast<char>(w[0] - 'a' + 'A');
      text += w;
    }
    text += rng.below(4) == 0 ? ":\n\n" : ".\n";
  }
  return text;
}

TokenizerOptions sp_options(int64_t vocab, const std::string& type = "bpe") {
  TokenizerOptions o;
  o.kind = "sentencepiece";
  o.vocab_size = vocab;
  o.sp_type = type;
  return o;
}

std::unique_ptr<Tokenizer> learn(const std::string& text, int64_t vocab, const std::string& type = "bpe") {
  return build_tokenizer(sp_options(vocab, type), CorpusText::of(text, text, "test text"));
}

}  // namespace

TEST_CASE("sentencepiece: a learnt BPE / unigram vocabulary has the size asked for and round-trips any text") {
  const std::string text = word_text();
  for (const char* type : {"bpe", "unigram"}) {
    CAPTURE(type);
    const auto tok = learn(text, 350, type);
    CHECK(tok->kind() == "sentencepiece");
    CHECK(tok->vocab_size() == 350);
    const std::vector<int32_t> ids = tok->encode(text);
    CHECK(ids.size() < text.size());  // subwords: fewer tokens than characters
    if (std::string(type) == "bpe") CHECK(ids.size() * 3 < text.size() * 2);  // at 350 pieces: 1.9 characters a token
    CHECK(tok->decode(ids) == text);
    // Whatever the training text lacked: leading and repeated spaces, blank
    // lines, unseen characters (as UTF-8 bytes), a text without a final newline.
    for (const std::string& s : {std::string(" the  king\n\n\nqueen "), std::string("héllo ☃ — 世界\tok"),
                                std::string("\n"), std::string("zebra")}) {
      CAPTURE(s);
      CHECK(tok->decode(tok->encode(s)) == s);
    }
    CHECK(tok->encode("").empty());
  }
}

TEST_CASE("sentencepiece: newline is one piece no other piece crosses; unseen characters become byte pieces") {
  const std::string text = word_text();
  const auto learnt = learn(text, 400);
  const auto& tok = dynamic_cast<const SentencePieceTokenizer&>(*learnt);
  const std::vector<int32_t> nl = tok.encode("\n");
  REQUIRE(nl.size() == 1);
  CHECK(tok.piece(nl[0]) == "\n");
  for (int32_t id = 0; id < tok.vocab_size(); ++id)
    if (id != nl[0]) CHECK(tok.piece(id).find('\n') == std::string::npos);
  // Lines encode on their own: the ids of a text are those of its lines joined by the newline id.
  const std::string a = "Good lord, what must", b = "  thou speak";
  std::vector<int32_t> joined = tok.encode(a);
  joined.push_back(nl[0]);
  for (int32_t id : tok.encode(b)) joined.push_back(id);
  CHECK(tok.encode(a + "\n" + b) == joined);
  // '☃' (E2 98 83) is not in the training text: three byte pieces.
  const std::vector<int32_t> snow = tok.encode("☃");
  REQUIRE(snow.size() == 3);
  CHECK(tok.piece(snow[0]) == "<0xE2>");
  CHECK(tok.piece(snow[2]) == "<0x83>");
  CHECK_THROWS_WITH_AS(tok.decode({400}), "decode: token 400 is outside the vocabulary of 400", Error);
  CHECK_THROWS_WITH_AS(tok.piece(-1), Contains("outside the vocabulary"), Error);
}

TEST_CASE("sentencepiece: learning is deterministic, and encoding does not depend on the thread count") {
  const std::string text = word_text();
  const int threads = parallel::num_threads();
  parallel::set_num_threads(1);
  const auto one = learn(text, 350);
  std::string big;  // several parallel encoding blocks
  while (big.size() < (300u << 10)) big += text;
  const std::vector<int32_t> serial = one->encode(big);
  parallel::set_num_threads(2);
  const auto two = learn(text, 350);
  CHECK(save_tokenizer(*one) == save_tokenizer(*two));
  CHECK(two->encode(big) == serial);
  parallel::set_num_threads(threads);
}

TEST_CASE("sentencepiece: state, blob and .model file give the same tokenizer; bad models are refused by name") {
  TempDir dir("sentencepiece");
  const std::string text = word_text();
  const auto tok = learn(text, 320);
  const std::string blob = save_tokenizer(*tok);
  CHECK(blob.substr(0, 4) == std::string("\2\0\0\0", 4));  // version 2: with the model
  const auto back = load_tokenizer(blob);
  CHECK(back->kind() == "sentencepiece");
  CHECK(back->encode(text) == tok->encode(text));
  CHECK(save_tokenizer(*back) == blob);

  // The model proto is a .model file as spm_train writes it.
  const std::string model = (dir.path / "sp.model").string();
  std::ofstream(model, std::ios::binary) << tok->state().model;
  TokenizerOptions from_file;
  from_file.kind = "sentencepiece";
  from_file.sp_model = model;
  const auto read = build_tokenizer(from_file, CorpusText::of("", "", "unused"));
  CHECK(read->encode(text) == tok->encode(text));

  from_file.sp_model = (dir.path / "missing.model").string();
  CHECK_THROWS_WITH_AS(build_tokenizer(from_file, CorpusText::of("", "")), Contains("missing.model': cannot open"), Error);
  const std::string junk = (dir.path / "junk.model").string();
  std::ofstream(junk, std::ios::binary) << "not a protobuf at all";
  from_file.sp_model = junk;
  CHECK_THROWS_WITH_AS(build_tokenizer(from_file, CorpusText::of("", "")),
                       Contains("junk.model': not a sentencepiece model"), Error);
  CHECK_THROWS_WITH_AS(make_tokenizer(TokenizerState{"sentencepiece", {}, "garbage"}),
                       Contains("tokenizer state: not a sentencepiece model"), Error);
  CHECK_THROWS_WITH_AS(make_tokenizer(TokenizerState{"sentencepiece", {}, ""}), Contains("an empty sentencepiece model"),
                       Error);
  CHECK_THROWS_WITH_AS(make_tokenizer(TokenizerState{"sentencepiece", {97}, tok->state().model}),
                       Contains("stores a model, not a vocabulary of 1 entries"), Error);
  CHECK_THROWS_WITH_AS(make_tokenizer(TokenizerState{"char", {97}, "x"}), Contains("a char tokenizer has no model"), Error);
  // A model count beyond 64 MiB is refused before allocating.
  std::string bad = blob.substr(0, 4 + 8 + 13 + 8);  // version, kind "sentencepiece", empty vocab
  const uint64_t huge = uint64_t{1} << 40;
  bad.append(reinterpret_cast<const char*>(&huge), 8);
  CHECK_THROWS_WITH_AS(load_tokenizer(bad), Contains("model: a count of 1099511627776, more than the 67108864 possible"),
                       Error);
}

TEST_CASE("sentencepiece: options are checked by field name") {
  const std::string text = word_text();
  CHECK_THROWS_WITH_AS(learn(text, 0), Contains("data.tokenizer \"sentencepiece\" needs data.vocab_size"), Error);
  CHECK_THROWS_WITH_AS(learn(text, 100000), Contains("data.vocab_size must be in [0, 65536]"), Error);
  CHECK_THROWS_WITH_AS(learn(text, 300, "wordpiece"), Contains("data.sp_type must be \"bpe\" or \"unigram\""), Error);
  // Fewer ids than 256 bytes + <unk> + "\n" + the characters: the key and the
  // size to set, not SentencePiece's source location and condition.
  CHECK_THROWS_WITH_AS(learn(text, 200),
                       Contains("test text: data.vocab_size = 200 is too small for this text: a sentencepiece "
                                "vocabulary of it needs at least "),
                       Error);
  try {
    learn(text, 200);
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find(".cc(") == std::string::npos);
  }
  CHECK_THROWS_WITH_AS(learn(text, 60000, "unigram"),
                       Contains("test text: data.vocab_size = 60000 is too large for this text: a sentencepiece "
                                "unigram vocabulary learnt from it holds at most "),
                       Error);
  CHECK_THROWS_WITH_AS(learn("\n\n\n", 300), Contains("the training split has no text"), Error);
  TokenizerOptions both = sp_options(300);
  both.sp_model = "x.model";
  CHECK_THROWS_WITH_AS(build_tokenizer(both, CorpusText::of(text, text)),
                       Contains("already fixes the vocabulary: set one of them"), Error);
  TokenizerOptions chars;
  chars.vocab_size = 300;
  CHECK_THROWS_WITH_AS(build_tokenizer(chars, CorpusText::of(text, text)),
                       Contains("data.vocab_size is 300 but data.tokenizer \"char\" takes its vocabulary from the corpus"),
                       Error);
}

TEST_CASE("sentencepiece corpora: the text is split by characters, the vocabulary learnt from the train part only") {
  TempDir dir("sentencepiece-corpus");
  std::string text = word_text();
  text += "Zebras quagga okapi.\n";  // only in the val split
  const std::string path = (dir.path / "text.txt").string();
  std::ofstream(path, std::ios::binary) << text;
  const LoadedCorpus data = load_corpus(path, sp_options(400), 0.1);
  const size_t at = split_offset(text, 0.1, true);
  CHECK(at == static_cast<size_t>(static_cast<double>(text.size()) * 0.9));  // ASCII: characters are bytes
  CHECK(data.corpus.train() == data.tokenizer->encode(text.substr(0, at)));
  CHECK(data.corpus.val() == data.tokenizer->encode(text.substr(at)));
  CHECK(data.corpus.val_characters() == static_cast<int64_t>(text.size() - at));
  // 'Z', 'q' never occur in the train part, so they are spelt in bytes.
  const auto& sp = dynamic_cast<const SentencePieceTokenizer&>(*data.tokenizer);
  const std::vector<int32_t> z = sp.encode("Z");
  REQUIRE(z.size() == 1);
  CHECK(sp.piece(z[0]) == "<0x5A>");
  // A multi-byte text splits on a character boundary.
  CHECK(split_offset("ééééé", 0.4, true) == 6);
  CHECK(split_offset("ééééé", 0.4, false) == 6);  // 10 bytes: 6 of them
  CHECK(split_offset("aéééé", 0.5, true) == 3);

  // Token files hold the same ids, and the characters they decode to are counted back.
  const PreparedFiles p = prepare_token_files(path, (dir.path / "tok").string(), sp_options(400), 0.1);
  CHECK(p.vocab_size == 400);
  const TokenFile train((dir.path / "tok" / "train.bin").string()), val((dir.path / "tok" / "val.bin").string());
  std::vector<int32_t> ids(static_cast<size_t>(train.size()));
  train.read(0, train.size(), ids.data());
  CHECK(ids == data.corpus.train());
  ids.resize(static_cast<size_t>(val.size()));
  val.read(0, val.size(), ids.data());
  CHECK(ids == data.corpus.val());
  CHECK(count_characters(val, *data.tokenizer) == data.corpus.val_characters());
  std::ifstream in(dir.path / "tok" / "tokenizer.bin", std::ios::binary);
  const std::string blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(blob == save_tokenizer(*data.tokenizer));
}

TEST_CASE("StreamDecoder prints whole characters only, for byte tokens and byte-fallback pieces") {
  const std::string text = "héllo ☃ 世界\n";
  ByteTokenizer bytes;
  const auto sp = learn(word_text(), 320);
  for (const Tokenizer* tok : std::vector<const Tokenizer*>{&bytes, sp.get()}) {
    CAPTURE(tok->kind());
    StreamDecoder out(*tok);
    std::string printed;
    for (int32_t id : tok->encode(text)) {
      const std::string piece = out.push(id);
      CHECK(utf8_error_offset(piece) == std::string::npos);  // never half a character
      printed += piece;
    }
    printed += out.flush();
    CHECK(printed == text);
  }
  // A byte that never completes a character is still printed, after at most 4 tokens.
  StreamDecoder out(bytes);
  CHECK(out.push(0xE2).empty());
  CHECK(out.push('a') == "\xE2" "a");
  CHECK(out.flush().empty());
}
