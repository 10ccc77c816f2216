// data/: tokenizers and strict UTF-8, corpus files and the split, the window sampler.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cereal/archives/binary.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "tapeformer/core/error.h"
#include "tapeformer/core/serialize.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/dataset.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/data/token_file.h"
#include "tapeformer/data/tokenizer.h"
#include "temp_dir.h"

using namespace tapeformer;
using doctest::Contains;
namespace fs = std::filesystem;

namespace {

// The load itself, unwrapped (from_bytes adds a context to its errors).
template <class T>
void from_binary(const std::string& bytes, T& value) {
  std::istringstream in(bytes);
  cereal::BinaryInputArchive ar(in);
  ar(value);
}

// A batch source's position as the checkpoint stores it, and loaded back.
std::string position_bytes(const BatchSource& source) {
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive ar(out);
    source.save_position(ar);
  }
  return out.str();
}
void load_position_bytes(const std::string& bytes, BatchSource& source) {
  std::istringstream in(bytes);
  cereal::BinaryInputArchive ar(in);
  source.load_position(ar);
}

std::string write_file(const TempDir& dir, const std::string& name, const std::string& content) {
  const std::string path = (dir.path / name).string();
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::vector<int32_t> iota_tokens(int n) {
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = i;
  return tokens;
}

}  // namespace

TEST_CASE("CharTokenizer: sorted code-point vocabulary, exact round trip on multi-byte UTF-8") {
  const std::string text = "héllo — 世界 héllo\n";
  CharTokenizer tok(text);
  // \n, space, h, l, o, é, —, 世, 界 in code point order: ids are ranks.
  CHECK(tok.vocab() == std::vector<uint32_t>{0x0A, 0x20, 0x68, 0x6C, 0x6F, 0xE9, 0x2014, 0x4E16, 0x754C});
  const auto ids = tok.encode(text);
  CHECK(ids.size() == 17);  // characters, not bytes
  CHECK(ids[1] == 5);       // 'é'
  CHECK(tok.decode(ids) == text);
  CHECK(tok.decode(tok.encode("世界 — hé")) == "世界 — hé");
  CHECK(CharTokenizer("\n界hé ol世—").vocab() == tok.vocab());  // same characters in another order
  CharTokenizer astral("a😀b");                                    // a 4-byte sequence is one character
  CHECK(astral.vocab_size() == 3);
  CHECK(astral.decode(astral.encode("😀a")) == "😀a");
}

TEST_CASE("CharTokenizer: characters outside the vocabulary are named with code and offset") {
  CharTokenizer tok(std::string("abc"));
  CHECK_THROWS_WITH_AS(tok.encode("abz"), "character 'z' (U+007A) at byte offset 2 is not in the vocabulary (3 characters)",
                       Error);
  CHECK_THROWS_WITH_AS(tok.encode("a\xc3\xa9"), Contains("'é' (U+00E9) at byte offset 1 is not"), Error);
  CHECK_THROWS_WITH_AS(tok.encode("ab\x01"), Contains("character U+0001 at byte offset 2"), Error);
  CHECK_THROWS_WITH_AS(tok.encode("a\n"), Contains("character '\\n' (U+000A) at byte offset 1"), Error);
  CHECK_THROWS_WITH_AS(tok.encode("ab\xff"), "text is not valid UTF-8 (bad byte 0xFF at offset 2)", Error);
  CHECK_THROWS_WITH_AS(tok.decode({3}), "decode: token 3 is outside the vocabulary of 3", Error);
  CHECK_THROWS_WITH_AS(tok.decode({-1}), Contains("token -1 is outside"), Error);
  CHECK_THROWS_WITH_AS(CharTokenizer{std::string()}, Contains("text is empty"), Error);
}

TEST_CASE("strict UTF-8: overlong, surrogate, out of range, truncated and stray bytes are rejected") {
  const auto npos = std::string_view::npos;
  CHECK(utf8_error_offset("plain ascii") == npos);
  CHECK(utf8_error_offset("ok \xe4\xb8\x96 \xf0\x9f\x98\x80") == npos);  // 世 and 😀
  CHECK(utf8_error_offset("\xef\xbf\xbf\xf4\x8f\xbf\xbf") == npos);     // U+FFFF and U+10FFFF
  CHECK(utf8_error_offset("ab\xc0\xaf") == 2);                          // overlong '/' (2 bytes)
  CHECK(utf8_error_offset("\xe0\x80\xaf") == 0);                        // overlong '/' (3 bytes)
  CHECK(utf8_error_offset("\xf0\x80\x80\xaf") == 0);                    // overlong '/' (4 bytes)
  CHECK(utf8_error_offset("\xed\xa0\x80") == 0);                        // surrogate U+D800
  CHECK(utf8_error_offset("ok\xed\xbf\xbf") == 2);                      // surrogate U+DFFF
  CHECK(utf8_error_offset("x\xf4\x90\x80\x80") == 1);                   // U+110000
  CHECK(utf8_error_offset("x\xf5\x80\x80\x80") == 1);                   // lead byte F5
  CHECK(utf8_error_offset("abc\xe4\xb8") == 3);                         // truncated at the end
  CHECK(utf8_error_offset("abc\xe4x\x96") == 3);                        // truncated by 'x'
  CHECK(utf8_error_offset("a\x80") == 1);                               // stray continuation
  CHECK(utf8_error_offset("caf\xe9 au lait") == 3);                     // Latin-1
  CHECK_THROWS_WITH_AS(utf8_decode("ab\xc0\xaf"), "invalid UTF-8 at byte offset 2 (byte 0xC0)", Error);
  CHECK_THROWS_WITH_AS(CharTokenizer(std::string("caf\xe9"), "data file 'x.txt'"),
                       Contains("data file 'x.txt' is not valid UTF-8 (bad byte 0xE9 at offset 3)"), Error);
  std::string s;
  for (uint32_t cp : {0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u, 0x10FFFFu}) utf8_append(s, cp);
  CHECK(utf8_decode(s) == std::vector<uint32_t>{0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, 0x10FFFF});
  CHECK_THROWS_WITH_AS(utf8_append(s, 0xD800), "utf8_append: U+D800 is not a Unicode scalar value", Error);
  // Counting characters, finding the n-th, and the unfinished sequence at the end of a chunk.
  CHECK(count_characters("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82") == 4);
  CHECK(character_offset("a\xc3\xa9\xe2\x82\xac!", 2) == 3);
  CHECK(character_offset("ab", 5) == 2);
  for (const auto& [text, tail] : std::vector<std::pair<std::string, size_t>>{
           {"a", 0}, {"a\xc3", 1}, {"a\xc3\xa9", 0}, {"\xe2\x82", 2}, {"\xe2\x82\xac", 0}, {"x\xf0\x9f\x99", 3},
           {"\xf0\x9f\x99\x82", 0}, {"", 0}}) {
    CAPTURE(text);
    CHECK(utf8_incomplete_tail(text) == tail);
  }
}

TEST_CASE("ByteTokenizer round-trips arbitrary bytes") {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += static_cast<char>(255 - i);
  bytes += std::string("\0\xff\xc0\xaf", 4);
  ByteTokenizer b;
  const auto ids = b.encode(bytes);
  CHECK(ids[0] == 255);
  CHECK(ids[256] == 0);
  CHECK(b.decode(ids) == bytes);
  CHECK_THROWS_WITH_AS(b.decode({256}), "decode: token 256 is not a byte (0..255)", Error);
  CHECK_THROWS_WITH_AS(make_tokenizer("bpe", "text"),
                       "data.tokenizer: unknown kind \"bpe\" (known: char, byte, sentencepiece, byte_bpe)", Error);
}

TEST_CASE("tokenizers survive save/load: cereal archive (TokenizerState) and blob") {
  CharTokenizer c("héllo — 世界");
  TokenizerState loaded;
  from_binary(to_bytes(c.state()), loaded);
  const auto back = make_tokenizer(loaded);
  CHECK(back->kind() == "char");
  CHECK(dynamic_cast<const CharTokenizer&>(*back).vocab() == c.vocab());
  CHECK(back->encode("世界 héllo") == c.encode("世界 héllo"));

  const auto blob_back = load_tokenizer(save_tokenizer(c));
  CHECK(blob_back->decode(c.encode("— l")) == "— l");
  CHECK(save_tokenizer(*blob_back) == save_tokenizer(c));
  const auto byte_back = load_tokenizer(save_tokenizer(ByteTokenizer()));
  CHECK(byte_back->kind() == "byte");
  CHECK(byte_back->vocab_size() == 256);

  // A future format version is refused by name, not misread.
  std::ostringstream future;
  {
    cereal::BinaryOutputArchive ar(future);
    ar(uint32_t{3}, std::string("char"), std::vector<uint32_t>{97});
  }
  TokenizerState s;
  CHECK_THROWS_WITH_AS(from_binary(future.str(), s),
                       "tokenizer state: format version 3 is not supported (this build reads versions 1 and 2)", Error);
  CHECK_THROWS_WITH_AS(load_tokenizer(future.str()), Contains("format version 3 is not supported"), Error);
  // A tokenizer without a model is still written as version 1, which every build reads.
  const std::string v1 = save_tokenizer(c);
  CHECK(v1.substr(0, 4) == std::string("\1\0\0\0", 4));
  std::ostringstream old;
  {
    cereal::BinaryOutputArchive ar(old);
    ar(uint32_t{1}, std::string("char"), c.vocab());
  }
  CHECK(old.str() == v1);
  CHECK_THROWS_WITH_AS(load_tokenizer("gar"), Contains("tokenizer: cannot decode"), Error);
  // Counts are bounded before allocating (found by tests/fuzz/fuzz_checkpoint):
  // a vocabulary of 2^40 entries, or a kind name of 2^40 bytes, is refused at once.
  for (const auto& [kind_bytes, vocab_size, message] :
       {std::tuple<uint64_t, uint64_t, const char*>{4, uint64_t{1} << 40,
                                                    "vocabulary: a count of 1099511627776, more than the 1112064 possible"},
        {uint64_t{1} << 40, 0, "kind name: a count of 1099511627776, more than the 16 possible"}}) {
    std::string blob(reinterpret_cast<const char*>(&TokenizerState::kVersion), 4);  // version 2: a model follows
    blob.append(reinterpret_cast<const char*>(&kind_bytes), 8);
    blob += "char";
    blob.append(reinterpret_cast<const char*>(&vocab_size), 8);
    CHECK_THROWS_WITH_AS(load_tokenizer(blob), Contains(message), Error);
  }
  CHECK(load_tokenizer(save_tokenizer(CharTokenizer("ab")))->vocab_size() == 2);
  CHECK_THROWS_WITH_AS(make_tokenizer(TokenizerState{"char", {98, 97}, {}}),
                       Contains("sorted and distinct (entry 1 'a' (U+0061) follows 'b' (U+0062))"), Error);
  CHECK_THROWS_WITH_AS(make_tokenizer(TokenizerState{"char", {0xD800}, {}}), Contains("U+D800) is not a Unicode"), Error);
  CHECK_THROWS_WITH_AS(make_tokenizer(TokenizerState{"wordpiece", {}, {}}), Contains("unknown kind 'wordpiece'"), Error);
}

TEST_CASE("corpus files: missing, unreadable, directory, empty, binary and non-UTF-8 files get one clear error each") {
  TempDir dir("data");
  CHECK_THROWS_WITH_AS(read_text_file("/no/such/file.txt"), "data file '/no/such/file.txt': cannot open (no such file)",
                       Error);
  const std::string is_dir = "data file '" + dir.path.string() + "' is a directory, not a text file";
  CHECK_THROWS_WITH_AS(read_corpus_file(dir.path.string(), "char"), is_dir.c_str(), Error);
  const std::string empty = write_file(dir, "empty.txt", "");
  CHECK_THROWS_WITH_AS(read_corpus_file(empty, "char"), ("data file '" + empty + "' is empty").c_str(), Error);
  CHECK_THROWS_WITH_AS(read_corpus_file(empty, "byte"), Contains("is empty"), Error);
  const std::string binary = write_file(dir, "bin.txt", std::string("abc\0def", 7));
  const std::string looks_binary = "data file '" + binary + "' looks binary (NUL byte at offset 3), not text";
  CHECK_THROWS_WITH_AS(read_text_file(binary), looks_binary.c_str(), Error);
  CHECK_THROWS_WITH_AS(read_corpus_file(binary, "char"), Contains("looks binary"), Error);
  CHECK(read_corpus_file(binary, "byte").size() == 7);  // the byte tokenizer takes anything non-empty
  const std::string latin1 = write_file(dir, "latin1.txt", "caf\xe9\n");
  const std::string not_utf8 =
      "data file '" + latin1 + "' is not valid UTF-8 (bad byte 0xE9 at offset 3); the byte tokenizer accepts arbitrary bytes";
  CHECK_THROWS_WITH_AS(read_corpus_file(latin1, "char"), not_utf8.c_str(), Error);
  CHECK(read_corpus_file(latin1, "byte") == "caf\xe9\n");
  CHECK(read_text_file(latin1) == "caf\xe9\n");  // UTF-8 is the char tokenizer's check
  CHECK_THROWS_WITH_AS(read_corpus_file(latin1, "bpe"), Contains("data.tokenizer: unknown kind \"bpe\""), Error);
  // Unreadable: /proc/self/mem opens but reading offset 0 fails (works as root, unlike chmod 000).
  if (std::ifstream("/proc/self/mem").good())
    CHECK_THROWS_WITH_AS(read_text_file("/proc/self/mem"), Contains("data file '/proc/self/mem': cannot read ("), Error);
  if (::geteuid() != 0) {
    const std::string locked = write_file(dir, "locked.txt", "secret");
    std::filesystem::permissions(locked, std::filesystem::perms::none);
    CHECK_THROWS_WITH_AS(read_text_file(locked), Contains("': cannot open (Permission denied)"), Error);
  }
  CHECK(read_corpus_file(write_file(dir, "good.txt", "héllo\n"), "char") == "héllo\n");
}

TEST_CASE("corpus and token files: a FIFO or device is refused before it is opened (opening a FIFO blocks)") {
  TempDir dir("fifo");
  const std::string fifo = (dir.path / "in.fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string want = "data file '" + fifo + "' is a FIFO, not a regular file";
  CHECK_THROWS_WITH_AS(read_corpus_file(fifo, "char"), want.c_str(), Error);
  CHECK_THROWS_WITH_AS(read_corpus_file("/dev/zero", "byte"),
                       "data file '/dev/zero' is a character device, not a regular file", Error);
  CHECK_THROWS_WITH_AS(prepare_token_files(fifo, (dir.path / "tok").string(), TokenizerOptions{}, 0.1),
                       want.c_str(), Error);
  CHECK_THROWS_WITH_AS(TokenFile{fifo}, ("token file '" + fifo + "' is a FIFO, not a regular file").c_str(), Error);
  // A token directory whose tokenizer.bin is a FIFO.
  const fs::path tokens = dir.path / "tokens";
  fs::create_directories(tokens);
  std::ofstream(tokens / "train.bin", std::ios::binary) << "abcd";
  std::ofstream(tokens / "val.bin", std::ios::binary) << "abcd";
  REQUIRE(::mkfifo((tokens / "tokenizer.bin").c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(load_training_data(tokens.string(), TokenizerOptions{}, 0.1, 0, nullptr),
                       ("tokenizer file '" + (tokens / "tokenizer.bin").string() + "' is a FIFO, not a regular file").c_str(),
                       Error);
}

TEST_CASE("corpus files: a UTF-8 byte order mark is no character of the text") {
  TempDir dir("bom");
  const std::string bom = "\xEF\xBB\xBF";
  const std::string path = write_file(dir, "bom.txt", bom + "hello world\n");
  CHECK(read_corpus_file(path, "char") == "hello world\n");
  CHECK(read_corpus_file(path, "byte") == bom + "hello world\n");  // bytes are kept as they are
  const LoadedCorpus c = load_corpus(path, "char", 0.5);
  CHECK(c.tokenizer->vocab_size() == CharTokenizer("hello world\n").vocab_size());
  CHECK(c.corpus.num_tokens() == 12);
  // Token files prepared from the file hold the same ids as the text read whole.
  const PreparedFiles p = prepare_token_files(path, (dir.path / "tok").string(), TokenizerOptions{}, 0.5);
  CHECK(p.vocab_size == c.tokenizer->vocab_size());
  CHECK(p.train_tokens == static_cast<int64_t>(c.corpus.train().size()));
  CHECK(p.val_tokens == static_cast<int64_t>(c.corpus.val().size()));
  // Only a BOM: nothing to train on.
  const std::string only = write_file(dir, "only.txt", bom);
  CHECK_THROWS_WITH_AS(read_corpus_file(only, "char"), ("data file '" + only + "' holds only a byte order mark").c_str(),
                       Error);
}

TEST_CASE("token directories: a truncated tokenizer.bin is named") {
  TempDir dir("trunc-tok");
  const std::string text = write_file(dir, "t.txt", "the quick brown fox jumps over the lazy dog\n");
  const std::string out = (dir.path / "tok").string();
  prepare_token_files(text, out, TokenizerOptions{}, 0.1);
  const fs::path tok = fs::path(out) / "tokenizer.bin";
  fs::resize_file(tok, fs::file_size(tok) / 2);
  const std::string want = "tokenizer file '" + tok.string() + "' is truncated or damaged (";
  CHECK_THROWS_WITH_AS(load_training_data(out, TokenizerOptions{}, 0.1, 0, nullptr), Contains(want.c_str()), Error);
}

TEST_CASE("TextCorpus: nanoGPT's split at int(n * 0.9), checked fractions, file loading") {
  CharTokenizer tok(std::string("abcdefghijklmnopqrstuvwxyz"));
  for (int n : {2, 9, 10, 11, 19, 97, 997, 1000, 12345}) {
    std::string text;
    for (int i = 0; i < n; ++i) text += static_cast<char>('a' + i % 26);
    TextCorpus corpus(text, tok, 0.1);
    const auto expected = static_cast<size_t>(n * 0.9);  // Python: int(n * 0.9)
    CAPTURE(n);
    CHECK(corpus.train().size() == expected);
    CHECK(corpus.val().size() == n - expected);
    CHECK(corpus.num_tokens() == n);
    CHECK(corpus.val().front() == (static_cast<int>(expected) % 26));  // the split is contiguous, in order
  }
  CHECK_THROWS_WITH_AS(TextCorpus("a", tok, 0.1, "tiny"),
                       "tiny has 1 characters: too few to split at val_fraction 0.1 (train would get 0, val 1; both need at "
                       "least 1)", Error);
  CHECK_THROWS_WITH_AS(TextCorpus("abcde", tok, 1e-17), Contains("train would get 5, val 0"), Error);
  for (double bad : {0.0, 1.0, -0.5, 1.5, std::nan("")})
    CHECK_THROWS_WITH_AS(TextCorpus("abcdef", tok, bad), Contains("TextCorpus: val_fraction must be in (0, 1), got"), Error);
  CHECK_THROWS_WITH_AS(TextCorpus("ab!", tok, 0.1, "data file 'p.txt'"),
                       "data file 'p.txt', val split from byte 2: character '!' (U+0021) at byte offset 0 is not in the "
                       "vocabulary (26 characters)",
                       Error);

  TempDir dir("corpus");
  const std::string path = write_file(dir, "shakespeare.txt", "First Citizen:\nBefore we proceed any further, hear me speak.\n");
  LoadedCorpus data = load_corpus(path, "char", 0.1);
  CHECK(data.tokenizer->kind() == "char");
  CHECK(data.tokenizer->vocab_size() == 27);
  CHECK(data.corpus.num_tokens() == 61);
  CHECK(data.corpus.train().size() == 54);  // int(61 * 0.9)
  CHECK(TextCorpus::from_file(path, *data.tokenizer, 0.1).val() == data.corpus.val());
  const std::string bin = write_file(dir, "bin.dat", std::string("\0\1\2\3\4\5\6\7\x80\xff", 10));
  LoadedCorpus bytes = load_corpus(bin, "byte", 0.2);
  CHECK(bytes.corpus.train() == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(bytes.corpus.val() == std::vector<int32_t>{128, 255});
  CHECK_THROWS_WITH_AS(TextCorpus::from_file(bin, *data.tokenizer, 0.1), Contains("looks binary"), Error);
}

TEST_CASE("RandomWindowSampler: targets are inputs shifted by one, offsets in range, every start reachable") {
  const std::vector<int32_t> tokens = iota_tokens(20);
  const int64_t B = 4, T = 5;
  RandomWindowSampler a(tokens, B, T, 7, "t"), b(tokens, B, T, 7, "t"), other(tokens, B, T, 8, "t");
  CHECK(a.num_windows() == 15);
  std::set<int32_t> starts;
  bool differs = false;
  for (int n = 0; n < 200; ++n) {
    const Batch x = a.next(), y = b.next();
    REQUIRE(x.inputs.shape == Shape{B, T});
    REQUIRE(x.targets.shape == Shape{B, T});
    REQUIRE(x.inputs.data == y.inputs.data);  // same seed, same batches
    REQUIRE(x.targets.data == y.targets.data);
    differs = differs || other.next().inputs.data != x.inputs.data;
    for (int r = 0; r < B; ++r) {
      const int32_t s = x.inputs.data[r * T];
      REQUIRE((s >= 0 && s <= 20 - T - 1));
      starts.insert(s);
      for (int t = 0; t < T; ++t) {
        REQUIRE(x.inputs.data[r * T + t] == s + t);
        REQUIRE(x.targets.data[r * T + t] == s + t + 1);
      }
    }
  }
  CHECK(differs);
  CHECK(a.drawn() == 200);
  CHECK(starts.size() == 15);  // starts 0..14: every window of 6 tokens in 20
  CHECK(*starts.rbegin() == 14);

  RandomWindowSampler exact(tokens, 3, 19, 1, "t");  // n = T + 1: the only window is the whole array
  CHECK(exact.next().targets.data[3 * 19 - 1] == 19);
  CHECK_THROWS_WITH_AS(RandomWindowSampler(iota_tokens(40), 2, 64, 1, "val split"),
                       "block size 64 needs at least 65 tokens, but the val split has 40 (use a smaller block size or "
                       "more data)", Error);
  CHECK_THROWS_WITH_AS(RandomWindowSampler(tokens, 0, 4, 1, "t"), Contains("batch size must be >= 1, got 0"), Error);
  CHECK_THROWS_WITH_AS(RandomWindowSampler(tokens, 2, -1, 1, "t"), Contains("block size must be >= 1, got -1"), Error);
}

TEST_CASE("RandomWindowSampler with align: windows start at every record and nowhere else") {
  // 5 records of 6 tokens, windows of 6 (block 5): exactly the records.
  const std::vector<int32_t> tokens = iota_tokens(30);
  RandomWindowSampler records(tokens, 4, 5, 3, "t", /*align=*/6);
  CHECK(records.num_windows() == 5);
  std::set<int32_t> starts;
  for (int n = 0; n < 100; ++n) {
    const Batch x = records.next();
    for (int r = 0; r < 4; ++r) starts.insert(x.inputs.data[static_cast<size_t>(r * 5)]);
  }
  CHECK(starts == std::set<int32_t>{0, 6, 12, 18, 24});
  // Shorter windows than records: still the records' starts.
  CHECK(RandomWindowSampler(tokens, 1, 3, 3, "t", 6).num_windows() == 5);
  CHECK_THROWS_WITH_AS(RandomWindowSampler(tokens, 1, 3, 3, "t", 0), Contains("align must be >= 1, got 0"), Error);
}

TEST_CASE("window_batch: rows are the windows at the given starts; a window past the end is refused") {
  const std::vector<int32_t> tokens{10, 11, 12, 13, 14, 15};
  const Batch b = window_batch(tokens, {0, 3, 2}, 2);
  CHECK(b.inputs.data == std::vector<int32_t>{10, 11, 13, 14, 12, 13});
  CHECK(b.targets.data == std::vector<int32_t>{11, 12, 14, 15, 13, 14});
  CHECK(window_batch(tokens, {3}, 2).targets.data == std::vector<int32_t>{14, 15});  // the last that fits
  CHECK_THROWS_WITH_AS(window_batch(tokens, {4}, 2), "window start 4 out of range for block size 2 in 6 tokens", Error);
  CHECK_THROWS_AS(window_batch(tokens, {-1}, 2), Error);
}

TEST_CASE("RandomWindowSampler: its position round-trips and the sampler continues identically") {
  const std::vector<int32_t> tokens = iota_tokens(100);
  RandomWindowSampler s(tokens, 3, 8, 11, "t");
  for (int i = 0; i < 5; ++i) s.next();
  const std::string saved = position_bytes(s);
  RandomWindowSampler r(tokens, 3, 8, 999, "t");
  load_position_bytes(saved, r);
  CHECK(r.drawn() == 5);
  for (int i = 0; i < 10; ++i) {
    const Batch expected = s.next(), got = r.next();
    CHECK(got.inputs.data == expected.inputs.data);
    CHECK(got.targets.data == expected.targets.data);
  }
  CHECK(position_bytes(r) == position_bytes(s));
}

TEST_CASE("StreamSampler: B contiguous streams, each row continuing the last, restarting when a stream runs out") {
  const std::vector<int32_t> tokens = iota_tokens(101);  // token i is i: positions are readable
  StreamSampler s(tokens, /*batch=*/4, /*block=*/10, "t");  // streams of 25 tokens: 2 segments each
  CHECK(s.stream_length() == 25);
  CHECK(s.segments() == 2);
  const Batch a = s.next();
  CHECK(s.restarted());
  const Batch b = s.next();
  CHECK_FALSE(s.restarted());
  for (int64_t r = 0; r < 4; ++r) {
    const size_t row = static_cast<size_t>(r * 10);
    CHECK(a.inputs.data[row] == r * 25);             // stream r starts at r L
    CHECK(b.inputs.data[row] == r * 25 + 10);        // and continues where the last batch stopped
    CHECK(b.targets.data[row + 9] == r * 25 + 20);  // targets one position further
  }
  const Batch c = s.next();  // 5 tokens left in each stream: start over
  CHECK(s.restarted());
  CHECK(c.inputs.data == a.inputs.data);
  // State round trip: a restored sampler continues identically.
  StreamSampler r(tokens, 4, 10, "t");
  load_position_bytes(position_bytes(s), r);
  CHECK(r.next().inputs.data == s.next().inputs.data);
  // ext: the 3 tokens before each segment come again first, their targets not counted.
  StreamSampler x(tokens, 4, 10, "t", /*ext=*/3);
  const Batch x0 = x.next(), x1 = x.next();
  REQUIRE(x0.inputs.shape == Shape({4, 10}));  // nothing before the streams' starts
  REQUIRE(x1.inputs.shape == Shape({4, 13}));
  for (int64_t r = 0; r < 4; ++r) {
    CHECK(x1.inputs.data[static_cast<size_t>(r * 13)] == r * 25 + 7);  // positions 7, 8, 9, then the segment 10..19
    CHECK(x1.inputs.data[static_cast<size_t>(r * 13 + 3)] == r * 25 + 10);
    for (int64_t t = 0; t < 3; ++t) CHECK(x1.targets.data[static_cast<size_t>(r * 13 + t)] == kIgnoreTarget);
    CHECK(x1.targets.data[static_cast<size_t>(r * 13 + 3)] == r * 25 + 11);
  }
  CHECK_THROWS_WITH_AS(StreamSampler(tokens, 11, 10, "val split"),
                       "block size 10 in 11 streams needs at least 111 tokens, but the val split has 101 (use a smaller "
                       "block or batch size or more data)",
                       Error);
}

TEST_CASE("RecallTask: each segment's query asks for the key `distance` segments back; nothing before that") {
  RecallTaskConfig cfg;
  cfg.distance = 2;
  cfg.segment = 8;
  RecallTask task(cfg, /*batch=*/3, /*seed=*/5);
  const auto key_of = [&](const Batch& b, int64_t row) {  // the token after the KEY marker
    for (int64_t t = 0; t + 1 < 8; ++t)
      if (b.inputs.data[static_cast<size_t>(row * 8 + t)] == task.key_marker())
        return b.inputs.data[static_cast<size_t>(row * 8 + t + 1)];
    FAIL("no KEY in row " << row);
    return -1;
  };
  std::vector<Batch> batches;
  for (int i = 0; i < 4; ++i) batches.push_back(task.next());
  for (int i = 0; i < 4; ++i)
    for (int64_t r = 0; r < 3; ++r) {
      CAPTURE(i);
      CAPTURE(r);
      const Batch& b = batches[static_cast<size_t>(i)];
      CHECK(b.inputs.data[static_cast<size_t>(r * 8 + 7)] == task.query_marker());
      const int32_t key = key_of(b, r);
      CHECK((key >= cfg.fillers && key < cfg.fillers + cfg.keys));
      for (int64_t t = 0; t < 7; ++t) CHECK(b.targets.data[static_cast<size_t>(r * 8 + t)] == kIgnoreTarget);
      const int32_t answer = b.targets.data[static_cast<size_t>(r * 8 + 7)];
      CHECK(answer == (i < 2 ? kIgnoreTarget : key_of(batches[static_cast<size_t>(i - 2)], r)));
    }
  cfg.distance = 0;
  CHECK_THROWS_WITH_AS(RecallTask(cfg, 3, 5), "RecallTask: distance must be in [1, 2^20], got 0", Error);
}

TEST_CASE("AssociativeRecallTask: facts KEY v n per segment; queries ask for one of this segment's and an earlier one's") {
  AssociativeRecallConfig cfg;
  cfg.names = 16;  // a name returns at the earliest 8 facts (4 segments) later
  cfg.facts = 2;
  cfg.distance = 3;
  cfg.segment = 14;  // two stretches of 5 for the facts, then the queries
  const int64_t B = 3, T = 14, F = 2, segments = 40;
  AssociativeRecallTask task(cfg, B, /*seed=*/7);
  const int32_t first_value = static_cast<int32_t>(cfg.fillers + cfg.names);
  struct Fact {
    int32_t name, value;
  };
  std::vector<std::vector<Fact>> facts(B);  // per stream, every fact, read off the inputs
  std::vector<int> asked(F, 0);             // which of a segment's facts the far query took
  for (int64_t i = 0; i < segments; ++i) {
    const Batch b = task.next();
    for (int64_t r = 0; r < B; ++r) {
      CAPTURE(i);
      CAPTURE(r);
      const int32_t* x = b.inputs.data.data() + r * T;
      const int32_t* y = b.targets.data.data() + r * T;
      std::vector<Fact>& past = facts[static_cast<size_t>(r)];
      const size_t before = past.size();
      CHECK(std::count(x, x + T, task.key_marker()) == F);
      for (int64_t f = 0; f < F; ++f) {  // fact f inside positions [5 f, 5 f + 5)
        const int64_t key_at = std::find(x + 5 * f, x + 5 * f + 3, task.key_marker()) - x;
        REQUIRE(key_at < 5 * f + 3);
        const Fact fact{x[key_at + 2], x[key_at + 1]};
        CHECK((fact.name >= cfg.fillers && fact.name < first_value));
        CHECK((fact.value >= first_value && fact.value < first_value + cfg.values));
        for (size_t back = 1; back < 8 && back <= past.size(); ++back)  // no name again within names / 2 facts
          CHECK(past[past.size() - back].name != fact.name);
        past.push_back(fact);
      }
      CHECK(x[T - 4] == task.query_marker());
      const bool local_ok = (x[T - 3] == past[before].name && y[T - 3] == past[before].value) ||
                            (x[T - 3] == past[before + 1].name && y[T - 3] == past[before + 1].value);
      CHECK(local_ok);
      CHECK(x[T - 2] == task.query_marker());
      if (i < cfg.distance) {
        CHECK(y[T - 1] == kIgnoreTarget);
      } else {
        const size_t seg = before - static_cast<size_t>(cfg.distance * F);  // the segment `distance` back
        int which = -1;
        for (int f = 0; f < F; ++f)
          if (x[T - 1] == past[seg + static_cast<size_t>(f)].name && y[T - 1] == past[seg + static_cast<size_t>(f)].value)
            which = f;
        REQUIRE(which >= 0);
        ++asked[static_cast<size_t>(which)];
      }
      for (int64_t t = 0; t < T; ++t)
        if (t != T - 3 && t != T - 1) CHECK(y[t] == kIgnoreTarget);
    }
  }
  CHECK(asked[0] > 10);  // both facts get asked
  CHECK(asked[1] > 10);
  // Saved and loaded, a task built alike continues with the same segments.
  std::stringstream buf;
  {
    cereal::BinaryOutputArchive out(buf);
    task.save_position(out);
  }
  AssociativeRecallTask again(cfg, B, /*seed=*/99);
  {
    cereal::BinaryInputArchive in(buf);
    again.load_position(in);
  }
  for (int i = 0; i < 3; ++i) {
    const Batch a = task.next(), b = again.next();
    CHECK(a.inputs.data == b.inputs.data);
    CHECK(a.targets.data == b.targets.data);
  }
  cfg.distance = 4;
  CHECK_THROWS_WITH_AS(AssociativeRecallTask(cfg, B, 7),
                       "AssociativeRecallTask: distance 4 x facts 2 must be in [1, 8) (names / 2, the facts within "
                       "which no name repeats)",
                       Error);
  cfg.distance = 1;
  cfg.segment = 9;
  CHECK_THROWS_WITH_AS(AssociativeRecallTask(cfg, B, 7),
                       "AssociativeRecallTask: segment must be in [10, 2^20] (4 + 3 facts), got 9", Error);
}

TEST_CASE("AssociativeRecallTask: with max_distance, each far query asks for a fact 1..max_distance segments back") {
  AssociativeRecallConfig cfg;
  cfg.names = 16;
  cfg.facts = 2;
  cfg.distance = 1;
  cfg.max_distance = 3;
  cfg.segment = 14;
  const int64_t B = 4, T = 14, F = 2;
  AssociativeRecallTask task(cfg, B, /*seed=*/11);
  std::vector<std::vector<int32_t>> names(B), values(B);  // per stream, every fact's name and value in order
  std::vector<int> at_distance(4, 0);
  for (int64_t i = 0; i < 60; ++i) {
    const Batch b = task.next();
    for (int64_t r = 0; r < B; ++r) {
      CAPTURE(i);
      const int32_t* x = b.inputs.data.data() + r * T;
      const int32_t* y = b.targets.data.data() + r * T;
      for (int64_t f = 0; f < F; ++f) {
        const int64_t key_at = std::find(x + 5 * f, x + 5 * f + 3, task.key_marker()) - x;
        REQUIRE(key_at < 5 * f + 3);
        values[static_cast<size_t>(r)].push_back(x[key_at + 1]);
        names[static_cast<size_t>(r)].push_back(x[key_at + 2]);
      }
      if (y[T - 1] == kIgnoreTarget) {
        CHECK(i < 3);  // only while the distance drawn reaches before the first segment
        continue;
      }
      int found = 0;  // the segment back, 1..3, stating the far query's name with its target
      for (int64_t d = 1; d <= 3 && d <= i; ++d)
        for (int64_t f = 0; f < F; ++f) {
          const size_t at = static_cast<size_t>((i - d) * F + f);
          if (names[static_cast<size_t>(r)][at] == x[T - 1] && values[static_cast<size_t>(r)][at] == y[T - 1])
            found = static_cast<int>(d);
        }
      REQUIRE(found > 0);
      ++at_distance[static_cast<size_t>(found)];
    }
  }
  for (int d = 1; d <= 3; ++d) CHECK(at_distance[static_cast<size_t>(d)] > 40);  // every distance drawn, ~75 each
  cfg.max_distance = 4;
  CHECK_THROWS_WITH_AS(AssociativeRecallTask(cfg, B, 7),
                       "AssociativeRecallTask: max_distance 4 must be 0 (fixed) or in [distance 1, 4) (max_distance x "
                       "facts below names / 2)",
                       Error);
}

TEST_CASE("CopyTask: w SEP w PAD..., targets only on the second copy") {
  CopyTask task({/*symbols=*/5, /*min_len=*/2, /*max_len=*/6}, /*batch=*/4, /*seed=*/3);
  const Batch b = task.next();
  REQUIRE(b.inputs.shape == Shape({4, 12}));
  for (int64_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    const int32_t* x = b.inputs.data.data() + r * 12;
    const int32_t* y = b.targets.data.data() + r * 12;
    int64_t L = 0;
    while (L < 12 && x[L] != task.sep()) ++L;
    REQUIRE((L >= 2 && L <= 6));
    for (int64_t t = 0; t < 12; ++t) {
      if (t >= L && t < 2 * L) {
        CHECK(y[t] == x[t - L]);  // position t predicts the (t - L)-th symbol of the copy
      } else {
        CHECK(y[t] == kIgnoreTarget);
      }
    }
    for (int64_t t = 2 * L + 1; t < 12; ++t) CHECK(x[t] == task.pad());
  }
}

TEST_CASE("CopyTask with reverse: w SEP reverse(w), the same w as the plain task from the same seed") {
  CopyTaskConfig cfg{/*symbols=*/5, /*min_len=*/2, /*max_len=*/6};
  CopyTask plain(cfg, /*batch=*/4, /*seed=*/3);
  cfg.reverse = true;
  CopyTask reversed(cfg, /*batch=*/4, /*seed=*/3);
  const Batch p = plain.next(), b = reversed.next();
  for (int64_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    const int32_t* x = b.inputs.data.data() + r * 12;
    const int32_t* y = b.targets.data.data() + r * 12;
    int64_t L = 0;
    while (L < 12 && x[L] != reversed.sep()) ++L;
    REQUIRE((L >= 2 && L <= 6));
    for (int64_t t = 0; t < L; ++t) CHECK(x[t] == p.inputs.data[static_cast<size_t>(r * 12 + t)]);
    for (int64_t t = 0; t < 12; ++t) {
      if (t >= L && t < 2 * L) {
        CHECK(y[t] == x[2 * L - 1 - t]);  // position t predicts symbol L - 1 - (t - L) of w
      } else {
        CHECK(y[t] == kIgnoreTarget);
      }
    }
  }
}

TEST_CASE("prepare_token_files: train.bin / val.bin hold TextCorpus's ids (also across 16 MiB chunk ends inside UTF-8)") {
  TempDir dir("token-files");
  // 34-byte lines after 7 bytes: the 16 MiB chunk end falls at byte 11 of a
  // line, inside its 4-byte sequence (bytes 10..13).
  std::string text = "1234567";
  const std::string line = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82 to be or not to be\n";  // 2-, 3- and 4-byte sequences
  REQUIRE(line.size() == 34);
  REQUIRE(((16u << 20) - 7) % 34 == 11);
  while (text.size() < (17u << 20)) text += line;
  const fs::path path = dir.path / "text.txt";
  std::ofstream(path, std::ios::binary) << text;
  int calls = 0;
  const PreparedFiles p = prepare_token_files(path.string(), (dir.path / "tok").string(), TokenizerOptions{}, 0.1,
                                              [&](const char*, int64_t, int64_t) { ++calls; });
  CHECK(calls >= 6);  // three passes of two chunks
  CharTokenizer tok(text);
  const TextCorpus corpus(text, tok, 0.1);
  CHECK(p.vocab_size == tok.vocab_size());
  CHECK(p.train_tokens == static_cast<int64_t>(corpus.train().size()));
  CHECK(p.val_tokens == static_cast<int64_t>(corpus.val().size()));
  const TokenFile train((dir.path / "tok" / "train.bin").string()), val((dir.path / "tok" / "val.bin").string());
  std::vector<int32_t> ids(static_cast<size_t>(train.size()));
  train.read(0, train.size(), ids.data());
  CHECK(ids == corpus.train());
  ids.resize(static_cast<size_t>(val.size()));
  val.read(0, val.size(), ids.data());
  CHECK(ids == corpus.val());
  // The samplers read windows from a file as from memory.
  RandomWindowSampler a(train, 3, 16, 7, "t"), b(corpus.train(), 3, 16, 7, "t");
  for (int i = 0; i < 3; ++i) CHECK(a.next().targets.data == b.next().targets.data);
  CHECK_THROWS_WITH_AS(train.read(train.size() - 2, 3, ids.data()), Contains("outside its"), Error);
  std::ofstream(dir.path / "odd.bin", std::ios::binary) << "abc";
  CHECK_THROWS_WITH_AS(TokenFile((dir.path / "odd.bin").string()),
                       Contains("3 bytes is not a non-empty array of uint16 ids"), Error);
}
