// data/nanogpt_meta.h: nanoGPT's char-level data directory (fixtures written
// by tests/fixtures/make_nanogpt_char.py, as nanoGPT's prepare.py does).
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "tapeformer/core/error.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/nanogpt_meta.h"
#include "tapeformer/data/token_file.h"
#include "temp_dir.h"

using namespace tapeformer;
using doctest::Contains;

namespace {

const std::string kDir = std::string(TAPEFORMER_FIXTURE_DIR) + "/nanogpt_char/";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string write_bytes(const TempDir& dir, const std::string& bytes) {
  const std::string path = (dir.path / "meta.pkl").string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A protocol-2 pickle of {'itos': {0: a, 1: b}} built by hand.
std::string itos_pickle(const std::string& a, const std::string& b) {
  const auto str = [](const std::string& s) { return std::string("\x8c") + static_cast<char>(s.size()) + s; };
  return std::string("\x80\x02}(") + str("itos") + "}(K" + '\0' + str(a) + "K\x01" + str(b) + "uu.";
}

}  // namespace

TEST_CASE("nanoGPT meta.pkl: its itos is the char tokenizer of the text, and train.bin / val.bin are our split") {
  const std::string text = read_bytes(kDir + "input.txt");
  const CharTokenizer expected(text);
  for (const char* file : {"meta.pkl", "meta_protocol2.pkl"}) {
    CAPTURE(file);
    const auto tok = read_nanogpt_meta(kDir + file);
    REQUIRE(tok->kind() == "char");
    CHECK(dynamic_cast<const CharTokenizer&>(*tok).vocab() == expected.vocab());
  }
  const TextCorpus corpus(text, expected, 0.1);
  const TokenFile train(kDir + "train.bin"), val(kDir + "val.bin");
  std::vector<int32_t> ids(static_cast<size_t>(train.size()));
  train.read(0, train.size(), ids.data());
  CHECK(ids == corpus.train());
  ids.resize(static_cast<size_t>(val.size()));
  val.read(0, val.size(), ids.data());
  CHECK(ids == corpus.val());
}

TEST_CASE("nanoGPT meta.pkl: truncated, damaged or foreign pickles are refused by name, never run") {
  TempDir dir("nanogpt-meta");
  const std::string good = read_bytes(kDir + "meta.pkl");
  CHECK_THROWS_WITH_AS(read_nanogpt_meta((dir.path / "none.pkl").string()), Contains("none.pkl': cannot open"), Error);
  CHECK_THROWS_WITH_AS(read_nanogpt_meta(write_bytes(dir, "")), Contains("meta.pkl' is empty"), Error);
  // Every cut of the file, and every byte flipped: an Error or a tokenizer, nothing else.
  for (size_t n = 1; n < good.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_AS(read_nanogpt_meta(write_bytes(dir, good.substr(0, n))), Error);
  }
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    try {
      read_nanogpt_meta(write_bytes(dir, bad));
    } catch (const Error&) {
    }
  }
  CHECK_THROWS_WITH_AS(read_nanogpt_meta(write_bytes(dir, "\x80\x04]\x94.")),
                       Contains("pickle opcode 0x5D at byte 2 is not one nanoGPT's meta.pkl uses"), Error);
  CHECK_THROWS_WITH_AS(read_nanogpt_meta(write_bytes(dir, "cos\nsystem\n(S'ls'\ntR.")),
                       Contains("pickle opcode 0x63 at byte 0"), Error);  // GLOBAL: code, refused
  CHECK(dynamic_cast<const CharTokenizer&>(*read_nanogpt_meta(write_bytes(dir, itos_pickle("a", "é")))).vocab() ==
        std::vector<uint32_t>{'a', 0xE9});
  CHECK_THROWS_WITH_AS(read_nanogpt_meta(write_bytes(dir, itos_pickle("b", "a"))),
                       Contains("'itos' is not in code point order at id 1"), Error);
  CHECK_THROWS_WITH_AS(read_nanogpt_meta(write_bytes(dir, itos_pickle("a", "bc"))),
                       Contains("'itos'[1] is \"bc\", not one character"), Error);
  CHECK_THROWS_WITH_AS(read_nanogpt_meta(write_bytes(dir, "\x80\x02}.")), Contains("has no 'itos' dict"), Error);
}
