// Byte-level BPE (data/byte_bpe.h) against Hugging Face's GPT2TokenizerFast:
// the ids and the decoded text of every case in
// fixtures/hf_gpt2/tokenizer_cases.json (made by
// fixtures/make_hf_gpt2.py with a BPE trained by `tokenizers`), read from
// tokenizer.json and from vocab.json + merges.txt alike; then the state
// round trip and the files' refusals.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/data/byte_bpe.h"
#include "tapeformer/data/utf8.h"

using namespace tapeformer;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(TAPEFORMER_FIXTURE_DIR) / "hf_gpt2";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

void check_cases(const Tokenizer& tok) {
  const auto cases = nlohmann::json::parse(slurp(kDir / "tokenizer_cases.json"));
  REQUIRE(cases.size() >= 25);
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    const std::string bytes = unhex(c["bytes_hex"].get<std::string>());
    const std::vector<int32_t> ids = tok.encode(bytes);
    CHECK(ids == c["ids"].get<std::vector<int32_t>>());
    CHECK(tok.decode(ids) == c["decoded"].get<std::string>());
  }
}

}  // namespace

TEST_CASE("byte_bpe: ids and decoded text equal GPT2TokenizerFast's on every case (tokenizer.json)") {
  const auto tok = ByteBpeTokenizer::read((kDir / "tokenizer.json").string());
  check_cases(*tok);
}

TEST_CASE("byte_bpe: the same from vocab.json and merges.txt") {
  const auto tok = ByteBpeTokenizer::from_vocab_merges(slurp(kDir / "vocab.json"), slurp(kDir / "merges.txt"), "fixture");
  check_cases(*tok);
  const auto from_dir = ByteBpeTokenizer::read((kDir / "small_a").string());
  CHECK(from_dir->vocab_size() == tok->vocab_size());
}

TEST_CASE("byte_bpe: the state, and the files it writes, read back to the same tokenizer") {
  const auto tok = ByteBpeTokenizer::read(kDir.string());
  const std::unique_ptr<Tokenizer> back = make_tokenizer(tok->state());
  const auto again = ByteBpeTokenizer::from_vocab_merges(tok->vocab_json(), tok->merges_txt(), "written");
  const std::string text = "It's 2024: caf\xC3\xA9 \xF0\x9F\x98\x80  \r\n<|endoftext|>x\xE2\x82";
  CHECK(back->encode(text) == tok->encode(text));
  CHECK(again->encode(text) == tok->encode(text));
  CHECK(back->decode(tok->encode(text)) == utf8_replace_invalid(text));
}

TEST_CASE("utf8_replace_invalid: one U+FFFD per maximal subpart, as Python's errors=\"replace\"") {
  const std::string r = "\xEF\xBF\xBD";
  CHECK(utf8_replace_invalid("ab") == "ab");
  CHECK(utf8_replace_invalid("a\xE2\x82") == "a" + r);              // truncated: one
  CHECK(utf8_replace_invalid("\xC0\xAF") == r + r);                  // overlong: two
  CHECK(utf8_replace_invalid("\xED\xA0\x80") == r + r + r);          // a surrogate: three
  CHECK(utf8_replace_invalid("\xF4\x90\x80\x80") == r + r + r + r);  // above U+10FFFF: four
  CHECK(utf8_replace_invalid("\xF0\x9F\x98x") == r + "x");           // three of four bytes, then ASCII
  CHECK(utf8_replace_invalid("\x80\xFE\xFF") == r + r + r);
}

TEST_CASE("byte_bpe: bad files are refused naming the file and what is wrong") {
  const auto refused = [](const std::string& vocab, const std::string& merges, const std::string& expected) {
    CAPTURE(vocab);
    CAPTURE(merges);
    try {
      ByteBpeTokenizer::from_vocab_merges(vocab, merges, "dir 'x'");
      FAIL("accepted");
    } catch (const Error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find("dir 'x'") != std::string::npos);
      CHECK(what.find(expected) != std::string::npos);
    }
  };
  const auto tok = ByteBpeTokenizer::read(kDir.string());
  auto vocab = nlohmann::json::parse(tok->vocab_json());
  refused("{", "", "is not JSON");
  refused("[1, 2]", "", "must be an object");
  auto gap = vocab;
  gap.erase("!");
  refused(gap.dump(), "", "outside");  // the ids no longer run 0..n-1
  refused(vocab.dump(), "#version: 0.2\nab\n", "line 2 is not two tokens");
  refused(vocab.dump(), "zz\xC4\xA0 q\n", "not in the vocabulary");
  auto no_byte = vocab;
  const int64_t last = no_byte["\xC4\xA0"].get<int64_t>();
  no_byte.erase("\xC4\xA0");
  no_byte["<not a byte symbol>"] = last;
  refused(no_byte.dump(), "", "no token for byte 0x20");
  CHECK_THROWS_WITH_AS(ByteBpeTokenizer::read((kDir / "missing").string()),
                       doctest::Contains("does not exist"), Error);
  CHECK_THROWS_WITH_AS(ByteBpeTokenizer::from_tokenizer_json(R"({"model": {"type": "WordPiece"}})", "t.json"),
                       doctest::Contains("model.type is \"WordPiece\""), Error);
}

TEST_CASE("byte_bpe: added tokens past the model's vocabulary extend it; a gap in the ids is refused") {
  auto doc = nlohmann::json::parse(slurp(kDir / "tokenizer.json"));
  const int64_t n = static_cast<int64_t>(doc["model"]["vocab"].size());
  doc["added_tokens"].push_back({{"id", n}, {"content", "<|pad|>"}, {"special", true}});
  const auto tok = ByteBpeTokenizer::from_tokenizer_json(doc.dump(), "t.json");
  CHECK(tok->vocab_size() == n + 1);
  const std::vector<int32_t> ids = tok->encode("a<|pad|>b");
  REQUIRE(ids.size() == 3);
  CHECK(ids[1] == n);
  CHECK(tok->decode(ids) == "a<|pad|>b");
  doc["added_tokens"].back()["id"] = n + 1;
  CHECK_THROWS_WITH_AS(ByteBpeTokenizer::from_tokenizer_json(doc.dump(), "t.json"),
                       doctest::Contains("no token has id"), Error);
}
