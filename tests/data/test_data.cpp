#include <doctest/doctest.h>
#include <unistd.h>

#include <cereal/archives/binary.hpp>
#include <cereal/types/array.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/corpus.h"
#include "data/sampler.h"
#include "data/tokenizer.h"

using namespace tapeformer;
namespace fs = std::filesystem;

TEST_CASE("CharTokenizer: sorted code-point vocabulary, exact round trip on multi-byte UTF-8") {
  const std::string text = "héllo — 世界 héllo\n";
  CharTokenizer tok(text);
  const auto& v = tok.vocab();
  CHECK(std::is_sorted(v.begin(), v.end()));
  CHECK(tok.vocab_size() == 9);  // \n, space, h, é, l, o, —, 世, 界
  std::set<uint32_t> distinct;
  for (uint32_t c : utf8_decode(text)) distinct.insert(c);
  CHECK(static_cast<size_t>(tok.vocab_size()) == distinct.size());
  const auto ids = tok.encode(text);
  CHECK(ids.size() == utf8_decode(text).size());
  CHECK(tok.decode(ids) == text);
  CHECK(tok.encode("\n")[0] == 0);  // '\n' is the smallest code point
}

TEST_CASE("CharTokenizer: characters outside the vocabulary are named with code and offset") {
  CharTokenizer tok(std::string("abc"));
  CHECK_THROWS_WITH_AS(tok.encode("abz"), "character 'z' (U+007A) at byte offset 2 is not in the vocabulary (3 characters)",
                       Error);
  CHECK_THROWS_WITH_AS(tok.encode("a\xc3\xa9"), doctest::Contains("'é' (U+00E9) at byte offset 1"), Error);
  CHECK_THROWS_WITH_AS(tok.decode({3}), "decode: token 3 is outside the vocabulary of 3", Error);
}

TEST_CASE("strict UTF-8: overlong, surrogate, out of range, truncated and stray bytes are rejected") {
  CHECK(utf8_error_offset("plain ascii") == std::string::npos);
  CHECK(utf8_error_offset("ok \xe4\xb8\x96") == std::string::npos);
  CHECK(utf8_error_offset("ab\xc0\xaf") == 2);          // overlong '/'
  CHECK(utf8_error_offset("\xed\xa0\x80") == 0);        // surrogate U+D800
  CHECK(utf8_error_offset("x\xf4\x90\x80\x80") == 1);   // > U+10FFFF
  CHECK(utf8_error_offset("abc\xe4\xb8") == 3);         // truncated
  CHECK(utf8_error_offset("a\x80") == 1);               // stray continuation
  CHECK(utf8_error_offset("caf\xe9 au lait") == 3);     // Latin-1
  CHECK_THROWS_WITH_AS(CharTokenizer(std::string("caf\xe9"), "data file 'x.txt'"),
                       doctest::Contains("data file 'x.txt' is not valid UTF-8 (bad byte 0xE9 at offset 3)"), Error);
}

TEST_CASE("ByteTokenizer round-trips arbitrary bytes; tokenizers survive save/load") {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += static_cast<char>(i);
  ByteTokenizer b;
  CHECK(b.decode(b.encode(bytes)) == bytes);
  const auto back = load_tokenizer(save_tokenizer(b));
  CHECK(back->kind() == "byte");
  CharTokenizer c(std::string("hello world"));
  const auto back_c = load_tokenizer(save_tokenizer(c));
  CHECK(back_c->kind() == "char");
  CHECK(back_c->encode("world") == c.encode("world"));
  CHECK_THROWS_WITH_AS(load_tokenizer("garbage"), doctest::Contains("tokenizer: cannot decode"), Error);
}

namespace {
struct TempFile {
  fs::path path;
  explicit TempFile(const std::string& content, const std::string& name = "data.txt") {
    path = fs::temp_directory_path() / ("tapeformer-data-" + std::to_string(::getpid()) + "-" + name);
    std::ofstream(path, std::ios::binary) << content;
  }
  ~TempFile() { fs::remove(path); }
};
}  // namespace

TEST_CASE("read_text_file: missing, directory, empty and binary files get one clear error each") {
  CHECK_THROWS_WITH_AS(read_text_file("/no/such/file.txt"), "data file '/no/such/file.txt': cannot open (no such file)",
                       Error);
  CHECK_THROWS_WITH_AS(read_text_file(fs::temp_directory_path().string()), doctest::Contains("is a directory"), Error);
  TempFile empty("", "empty.txt");
  CHECK_THROWS_WITH_AS(read_text_file(empty.path.string()), doctest::Contains("is empty"), Error);
  TempFile binary(std::string("abc\0def", 7), "bin.txt");
  CHECK_THROWS_WITH_AS(read_text_file(binary.path.string()), doctest::Contains("looks binary (NUL byte at offset 3)"),
                       Error);
  TempFile good("hello\n");
  CHECK(read_text_file(good.path.string()) == "hello\n");
}

TEST_CASE("TextCorpus: nanoGPT's split at int(n * 0.9)") {
  std::string text;
  for (int i = 0; i < 997; ++i) text += static_cast<char>('a' + i % 26);
  CharTokenizer tok(text);
  TextCorpus corpus(text, tok, 0.1, "t");
  CHECK(corpus.train().size() == 897);  // int(997 * 0.9)
  CHECK(corpus.val().size() == 100);
  CHECK(corpus.train()[0] == 0);
  CHECK(corpus.val()[0] == tok.encode(std::string(1, text[897]))[0]);
  CHECK_THROWS_WITH_AS(TextCorpus("a", tok, 0.1, "tiny"), doctest::Contains("tiny has 1 tokens: too few"), Error);
}

TEST_CASE("RandomWindowSampler: targets are inputs shifted by one, every start reachable, deterministic") {
  std::vector<int32_t> tokens(20);
  for (int i = 0; i < 20; ++i) tokens[i] = i;
  RandomWindowSampler a(tokens, 4, 5, 7, "t"), b(tokens, 4, 5, 7, "t");
  std::set<int32_t> starts;
  for (int n = 0; n < 200; ++n) {
    const Batch x = a.next(), y = b.next();
    REQUIRE(x.inputs.data == y.inputs.data);
    for (int r = 0; r < 4; ++r) {
      const int32_t s = x.inputs.data[r * 5];
      starts.insert(s);
      for (int t = 0; t < 5; ++t) {
        REQUIRE(x.inputs.data[r * 5 + t] == s + t);
        REQUIRE(x.targets.data[r * 5 + t] == s + t + 1);
      }
    }
  }
  CHECK(starts.size() == 15);  // starts 0..14: every window of 6 tokens in 20
  CHECK(*starts.rbegin() == 14);
  CHECK_THROWS_WITH_AS(RandomWindowSampler(tokens, 2, 20, 1, "val split"),
                       doctest::Contains("block size 20 needs at least 21 tokens, but the val split has 20"), Error);
}

TEST_CASE("RandomWindowSampler: state round-trips through cereal and continues identically") {
  std::vector<int32_t> tokens(100);
  for (int i = 0; i < 100; ++i) tokens[i] = i;
  RandomWindowSampler s(tokens, 3, 8, 11, "t");
  for (int i = 0; i < 5; ++i) s.next();
  std::stringstream buf;
  {
    cereal::BinaryOutputArchive ar(buf);
    ar(s);
  }
  RandomWindowSampler r(tokens, 3, 8, 999, "t");
  {
    cereal::BinaryInputArchive ar(buf);
    ar(r);
  }
  CHECK(r.drawn() == 5);
  for (int i = 0; i < 5; ++i) CHECK(r.next().inputs.data == s.next().inputs.data);
}
