#include "tapeformer/data/byte_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/data/utf8.h"

namespace tapeformer {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxFileBytes = size_t{256} << 20;  // GPT-2's tokenizer.json is 1.4 MB
constexpr uint32_t kAlphabetEnd = 0x144;             // the byte alphabet's code points are below this

// GPT-2's pre-tokenising pattern (its encoder.py), as tokenizers' ByteLevel uses it.
constexpr const char* kPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Byte b's symbol: b itself when printable in Latin-1 ('!'..'~', '¡'..'¬',
// '®'..'ÿ'), else U+0100 + n for the n-th other byte in byte order.
std::vector<uint32_t> byte_symbols() {
  std::vector<uint32_t> symbol(256);
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    symbol[b] = printable ? b : 0x100 + n++;
  }
  return symbol;
}

const std::vector<std::string>& byte_symbol_text() {
  static const std::vector<std::string> text = [] {
    std::vector<std::string> t(256);
    const std::vector<uint32_t> symbol = byte_symbols();
    for (int b = 0; b < 256; ++b) utf8_append(t[static_cast<size_t>(b)], symbol[static_cast<size_t>(b)]);
    return t;
  }();
  return text;
}

// The compiled pattern, shared by every tokenizer (matching only reads it).
struct Pattern {
  pcre2_code* code = nullptr;
  Pattern() {
    int error = 0;
    PCRE2_SIZE at = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                         &error, &at, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      fail("byte_bpe: PCRE2 cannot compile GPT-2's pattern at offset ", at, ": ", reinterpret_cast<char*>(message));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT is missing
  }
  ~Pattern() { pcre2_code_free(code); }
};

const Pattern& pattern() {
  static const Pattern p;
  return p;
}

std::string read_text(const std::filesystem::path& path) {
  const std::string name = path.string();
  const auto text = read_regular_file(name, "tokenizer file", kMaxFileBytes);
  TAPEFORMER_CHECK(text.has_value(), "tokenizer file '", name, "' cannot be read: ", std::strerror(errno));
  return *text;
}

json parse(std::string_view text, const std::string& origin) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    fail(origin, " is not JSON: ", e.what());
  }
}

// vocab: {"token": id, ...} -> tokens by id.
std::vector<std::string> tokens_of(const json& vocab, const std::string& origin) {
  TAPEFORMER_CHECK(vocab.is_object(), origin, ": the vocabulary must be an object of token: id, got ", vocab.type_name());
  TAPEFORMER_CHECK(!vocab.empty() && vocab.size() <= 65536, origin, ": the vocabulary has ", vocab.size(),
                   " tokens; 1 to 65536 are supported (token files hold uint16 ids)");
  std::vector<std::string> tokens(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [token, id] : vocab.items()) {
    TAPEFORMER_CHECK(id.is_number_integer(), origin, ": the id of token '", token, "' is not an integer");
    const int64_t i = id.get<int64_t>();
    TAPEFORMER_CHECK(i >= 0 && i < static_cast<int64_t>(tokens.size()), origin, ": token '", token, "' has id ", i,
                     ", outside 0..", tokens.size() - 1, " (the ids of ", tokens.size(), " tokens must be 0..",
                     tokens.size() - 1, ", each once)");
    TAPEFORMER_CHECK(!seen[static_cast<size_t>(i)], origin, ": id ", i, " is given to both '", tokens[static_cast<size_t>(i)],
                     "' and '", token, "'");
    seen[static_cast<size_t>(i)] = true;
    tokens[static_cast<size_t>(i)] = token;
  }
  return tokens;
}

// merges.txt: an optional "#version" line, then "left right" per line.
std::vector<std::pair<std::string, std::string>> merges_of_text(std::string_view text, const std::string& origin) {
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    TAPEFORMER_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                         line.find(' ', space + 1) == std::string_view::npos,
                     origin, ": line ", line_no, " is not two tokens separated by one space");
    merges.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
  }
  return merges;
}

// tokenizer.json's model.merges: ["left right", ...] or [["left", "right"], ...].
std::vector<std::pair<std::string, std::string>> merges_of_json(const json& merges, const std::string& origin) {
  TAPEFORMER_CHECK(merges.is_array(), origin, ": model.merges must be an array");
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      TAPEFORMER_CHECK(space != std::string::npos && space > 0 && space + 1 < s.size() &&
                           s.find(' ', space + 1) == std::string::npos,
                       origin, ": model.merges[", i, "] is not two tokens separated by one space");
      out.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else {
      TAPEFORMER_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), origin, ": model.merges[",
                       i, "] is neither \"left right\" nor [\"left\", \"right\"]");
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  return out;
}

bool flag(const json& object, const char* key, bool fallback) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  return it->is_boolean() ? it->get<bool>() : fallback;
}

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

}  // namespace

ByteBpeTokenizer::ByteBpeTokenizer(ByteBpeModel model, const std::string& origin) : model_(std::move(model)) {
  const int64_t n = static_cast<int64_t>(model_.tokens.size());
  TAPEFORMER_CHECK(n > 0 && n <= 65536, origin, ": ", n, " tokens; 1 to 65536 are supported (token files hold uint16 ids)");
  ids_.reserve(model_.tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    const auto [it, fresh] = ids_.emplace(model_.tokens[static_cast<size_t>(id)], id);
    TAPEFORMER_CHECK(fresh, origin, ": token '", it->first, "' has two ids, ", it->second, " and ", id);
  }
  is_added_.assign(model_.tokens.size(), false);
  for (const auto& [id, text] : model_.added) {
    TAPEFORMER_CHECK(id >= 0 && id < n, origin, ": added token '", text, "' has id ", id, ", outside 0..", n - 1);
    TAPEFORMER_CHECK(!text.empty(), origin, ": added token ", id, " is empty");
    TAPEFORMER_CHECK(model_.tokens[static_cast<size_t>(id)] == text, origin, ": added token '", text, "' has id ", id,
                     ", which the vocabulary gives to '", model_.tokens[static_cast<size_t>(id)], "'");
    is_added_[static_cast<size_t>(id)] = true;
  }
  // Every byte has its one-symbol token, and every other token is made of
  // the alphabet's symbols (so that it decodes to bytes).
  const std::vector<uint32_t> symbol = byte_symbols();
  byte_of_symbol_.assign(kAlphabetEnd, -1);
  for (int b = 0; b < 256; ++b) byte_of_symbol_[symbol[static_cast<size_t>(b)]] = static_cast<int16_t>(b);
  byte_ids_.resize(256);
  for (int b = 0; b < 256; ++b) {
    const auto it = ids_.find(byte_symbol_text()[static_cast<size_t>(b)]);
    TAPEFORMER_CHECK(it != ids_.end(), origin, ": the vocabulary has no token for byte ", hex_byte(static_cast<unsigned char>(b)),
                     " ('", byte_symbol_text()[static_cast<size_t>(b)], "'): a byte-level BPE needs all 256");
    byte_ids_[static_cast<size_t>(b)] = it->second;
  }
  for (int32_t id = 0; id < n; ++id) {
    if (is_added_[static_cast<size_t>(id)]) continue;
    const std::string& t = model_.tokens[static_cast<size_t>(id)];
    TAPEFORMER_CHECK(!t.empty(), origin, ": token ", id, " is empty");
    const size_t bad = utf8_error_offset(t);
    TAPEFORMER_CHECK(bad == std::string::npos, origin, ": token ", id, " is not valid UTF-8");
    for (const uint32_t cp : utf8_decode(t))
      TAPEFORMER_CHECK(cp < kAlphabetEnd && byte_of_symbol_[cp] >= 0, origin, ": token ", id, " ('", t, "') has ",
                       describe_code_point(cp), ", which is not one of the 256 byte symbols (is it an added token?)");
  }
  merges_.reserve(model_.merges.size());
  for (size_t rank = 0; rank < model_.merges.size(); ++rank) {
    const auto& [left, right] = model_.merges[rank];
    const auto l = ids_.find(left), r = ids_.find(right), joined = ids_.find(left + right);
    TAPEFORMER_CHECK(l != ids_.end() && r != ids_.end(), origin, ": merge ", rank + 1, " ('", left, "' '", right,
                     "') names a token that is not in the vocabulary");
    TAPEFORMER_CHECK(joined != ids_.end(), origin, ": merge ", rank + 1, " ('", left, "' '", right, "') makes '", left + right,
                     "', which is not in the vocabulary");
    // A pair listed twice keeps its first (lowest) rank, as tokenizers does.
    merges_.emplace(pair_key(l->second, r->second), std::make_pair(static_cast<int32_t>(rank), joined->second));
  }
  std::sort(model_.added.begin(), model_.added.end());
}

ByteBpeTokenizer::~ByteBpeTokenizer() = default;

std::unique_ptr<ByteBpeTokenizer> ByteBpeTokenizer::from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                                                                      const std::string& origin) {
  ByteBpeModel m;
  m.tokens = tokens_of(parse(vocab_json, origin + " (vocab.json)"), origin + " (vocab.json)");
  m.merges = merges_of_text(merges_txt, origin + " (merges.txt)");
  // GPT2Tokenizer's unk, bos and eos token: an added token when the vocabulary has it.
  const std::string eot = "<|endoftext|>";
  for (size_t id = 0; id < m.tokens.size(); ++id)
    if (m.tokens[id] == eot) m.added.emplace_back(static_cast<int32_t>(id), eot);
  return std::make_unique<ByteBpeTokenizer>(std::move(m), origin);
}

std::unique_ptr<ByteBpeTokenizer> ByteBpeTokenizer::from_tokenizer_json(std::string_view text, const std::string& origin) {
  const json doc = parse(text, origin);
  TAPEFORMER_CHECK(doc.is_object(), origin, ": not a tokenizer.json (the top level is not an object)");
  const auto model = doc.find("model");
  TAPEFORMER_CHECK(model != doc.end() && model->is_object(), origin, ": no \"model\" object");
  const std::string type = model->value("type", std::string());
  TAPEFORMER_CHECK(type == "BPE", origin, ": model.type is \"", type, "\"; byte_bpe reads byte-level BPE (\"BPE\") only");
  const auto pre = doc.find("pre_tokenizer");
  TAPEFORMER_CHECK(pre != doc.end() && pre->is_object(), origin,
                   ": no pre_tokenizer; byte_bpe reads byte-level BPE, whose pre_tokenizer is ByteLevel");
  const std::string pre_type = pre->value("type", std::string());
  TAPEFORMER_CHECK(pre_type == "ByteLevel", origin, ": pre_tokenizer.type is \"", pre_type,
                   "\"; byte_bpe reads byte-level BPE (pre_tokenizer ByteLevel, GPT-2's) only");
  TAPEFORMER_CHECK(flag(*pre, "use_regex", true), origin,
                   ": pre_tokenizer.use_regex is false; byte_bpe splits with GPT-2's pattern always");
  const auto normalizer = doc.find("normalizer");
  TAPEFORMER_CHECK(normalizer == doc.end() || normalizer->is_null(), origin,
                   ": it has a normalizer; byte_bpe reads GPT-2's tokenizers, which have none");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model->find(key);
    TAPEFORMER_CHECK(it == model->end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()), origin,
                     ": model.", key, " is set; GPT-2's BPE has none");
  }
  const auto dropout = model->find("dropout");
  TAPEFORMER_CHECK(dropout == model->end() || dropout->is_null(), origin, ": model.dropout is set; byte_bpe encodes deterministically");
  TAPEFORMER_CHECK(model->contains("vocab") && model->contains("merges"), origin, ": model needs \"vocab\" and \"merges\"");
  ByteBpeModel m;
  m.tokens = tokens_of((*model)["vocab"], origin + " (model.vocab)");
  m.merges = merges_of_json((*model)["merges"], origin);
  m.add_prefix_space = flag(*pre, "add_prefix_space", false);
  m.ignore_merges = flag(*model, "ignore_merges", false);
  const auto added = doc.find("added_tokens");
  if (added != doc.end() && !added->is_null()) {
    TAPEFORMER_CHECK(added->is_array(), origin, ": added_tokens must be an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      TAPEFORMER_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                           a["content"].is_string(),
                       origin, ": added_tokens[", i, "] needs an integer \"id\" and a string \"content\"");
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        TAPEFORMER_CHECK(!flag(a, key, false), origin, ": added_tokens[", i, "] sets ", key, ", which byte_bpe does not do");
      const int64_t id = a["id"].get<int64_t>();
      TAPEFORMER_CHECK(id >= 0 && id < 65536, origin, ": added_tokens[", i, "] has id ", id, ", outside 0..65535");
      m.added.emplace_back(static_cast<int32_t>(id), a["content"].get<std::string>());
    }
  }
  // Added tokens past the model's vocabulary extend the table (tokens added
  // after training); the ids must still run 0..n-1 without a gap.
  const size_t model_tokens = m.tokens.size();
  for (const auto& [id, text] : m.added) {
    if (static_cast<size_t>(id) < model_tokens) continue;
    if (static_cast<size_t>(id) >= m.tokens.size()) m.tokens.resize(static_cast<size_t>(id) + 1);
    TAPEFORMER_CHECK(m.tokens[static_cast<size_t>(id)].empty(), origin, ": added tokens '", m.tokens[static_cast<size_t>(id)],
                     "' and '", text, "' share id ", id);
    m.tokens[static_cast<size_t>(id)] = text;
  }
  for (size_t id = model_tokens; id < m.tokens.size(); ++id)
    TAPEFORMER_CHECK(!m.tokens[id].empty(), origin, ": no token has id ", id, " (model.vocab ends at ", model_tokens - 1,
                     " and added_tokens go to ", m.tokens.size() - 1, ")");
  return std::make_unique<ByteBpeTokenizer>(std::move(m), origin);
}

std::unique_ptr<ByteBpeTokenizer> ByteBpeTokenizer::read(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (!fs::is_directory(p, ec)) {
    TAPEFORMER_CHECK(fs::exists(p, ec), "tokenizer '", path, "' does not exist (give a directory with vocab.json and "
                                        "merges.txt, or a tokenizer.json)");
    return from_tokenizer_json(read_text(p), "tokenizer file '" + path + "'");
  }
  if (fs::exists(p / "tokenizer.json", ec))
    return from_tokenizer_json(read_text(p / "tokenizer.json"), "tokenizer file '" + (p / "tokenizer.json").string() + "'");
  const bool vocab = fs::exists(p / "vocab.json", ec), merges = fs::exists(p / "merges.txt", ec);
  TAPEFORMER_CHECK(vocab && merges, "tokenizer directory '", path, "' has ",
                   vocab ? "vocab.json but no merges.txt" : merges ? "merges.txt but no vocab.json" : "neither tokenizer.json nor vocab.json and merges.txt",
                   ": a byte-level BPE is read from tokenizer.json, or from vocab.json with merges.txt");
  return from_vocab_merges(read_text(p / "vocab.json"), read_text(p / "merges.txt"), "tokenizer directory '" + path + "'");
}

void ByteBpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out,
                                    std::unordered_map<std::string, std::vector<int32_t>>& cache) const {
  const std::string key(piece);
  const auto hit = cache.find(key);
  if (hit != cache.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t> word;
  word.reserve(piece.size());
  for (const char c : piece) word.push_back(byte_ids_[static_cast<unsigned char>(c)]);
  if (model_.ignore_merges && word.size() > 1) {
    std::string whole;
    for (const char c : piece) whole += byte_symbol_text()[static_cast<unsigned char>(c)];
    const auto it = ids_.find(whole);
    if (it != ids_.end()) word.assign(1, it->second);
  }
  // The pair of lowest rank, merged at every place it occurs (left to right),
  // until no adjacent pair has a rank.
  while (word.size() > 1) {
    int32_t best = std::numeric_limits<int32_t>::max(), merged = -1, l = -1, r = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = merges_.find(pair_key(word[i], word[i + 1]));
      if (it != merges_.end() && it->second.first < best)
        best = it->second.first, merged = it->second.second, l = word[i], r = word[i + 1];
    }
    if (merged < 0) break;
    size_t w = 0;
    for (size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size() && word[i] == l && word[i + 1] == r) {
        word[w++] = merged;
        ++i;
      } else {
        word[w++] = word[i];
      }
    }
    word.resize(w);
  }
  out.insert(out.end(), word.begin(), word.end());
  if (cache.size() < (1u << 16)) cache.emplace(key, std::move(word));
}

void ByteBpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::string prefixed;
  if (model_.add_prefix_space && (text.empty() || text.front() != ' ')) {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  if (text.empty()) return;
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(pattern().code, nullptr);
  TAPEFORMER_CHECK(match != nullptr, "byte_bpe: out of memory for a PCRE2 match");
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  try {
    while (at < text.size()) {
      const int rc = pcre2_match(pattern().code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      TAPEFORMER_CHECK(rc > 0, "byte_bpe: PCRE2 failed to split the text (error ", rc, ")");
      const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match);
      if (span[0] > at) encode_piece(text.substr(at, span[0] - at), out, cache);  // never for this pattern
      TAPEFORMER_CHECK(span[1] > span[0], "byte_bpe: the pattern matched nothing at byte ", span[0]);
      encode_piece(text.substr(span[0], span[1] - span[0]), out, cache);
      at = span[1];
    }
    if (at < text.size()) encode_piece(text.substr(at), out, cache);
  } catch (...) {
    pcre2_match_data_free(match);
    throw;
  }
  pcre2_match_data_free(match);
}

std::vector<int32_t> ByteBpeTokenizer::encode(std::string_view raw) const {
  const std::string text = utf8_replace_invalid(raw);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  std::string_view rest(text);
  while (!rest.empty()) {
    // The leftmost added token, the longest where two start at one place.
    size_t first = std::string_view::npos, length = 0;
    int32_t id = -1;
    for (const auto& [added_id, added] : model_.added) {
      const size_t at = rest.find(added);
      if (at == std::string_view::npos) continue;
      if (at < first || (at == first && added.size() > length)) first = at, length = added.size(), id = added_id;
    }
    if (first == std::string_view::npos) {
      encode_text(rest, out);
      break;
    }
    if (first > 0) encode_text(rest.substr(0, first), out);
    out.push_back(id);
    rest.remove_prefix(first + length);
  }
  return out;
}

std::string ByteBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    TAPEFORMER_CHECK(id >= 0 && id < vocab_size(), "byte_bpe: id ", id, " at position ", i, " is outside the vocabulary of ",
                     vocab_size(), " tokens");
    const std::string& token = model_.tokens[static_cast<size_t>(id)];
    if (is_added_[static_cast<size_t>(id)]) {
      bytes += token;
      continue;
    }
    uint32_t cp = 0;
    for (size_t at = 0; at < token.size();) {
      at += utf8_decode_one(token, at, &cp);  // checked at construction: valid, in the alphabet
      bytes += static_cast<char>(byte_of_symbol_[cp]);
    }
  }
  return utf8_replace_invalid(bytes);
}

std::string ByteBpeTokenizer::vocab_json() const {
  json vocab = json::object();
  for (size_t id = 0; id < model_.tokens.size(); ++id) vocab[model_.tokens[id]] = id;
  return vocab.dump(-1, ' ', false, json::error_handler_t::strict);
}

std::string ByteBpeTokenizer::merges_txt() const {
  std::string text = "#version: 0.2\n";
  for (const auto& [left, right] : model_.merges) text += left + " " + right + "\n";
  return text;
}

std::string ByteBpeTokenizer::tokenizer_json() const {
  json vocab = json::object();
  for (size_t id = 0; id < model_.tokens.size(); ++id) vocab[model_.tokens[id]] = id;
  json merges = json::array();
  for (const auto& [left, right] : model_.merges) merges.push_back(json::array({left, right}));
  json added = json::array();
  for (const auto& [id, text] : model_.added)
    added.push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", true}, {"special", true}});
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", model_.add_prefix_space}, {"trim_offsets", true},
                           {"use_regex", true}};
  const json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
        {"ignore_merges", model_.ignore_merges}, {"vocab", vocab}, {"merges", merges}}},
  };
  return doc.dump(-1, ' ', false, json::error_handler_t::strict);
}

TokenizerState ByteBpeTokenizer::state() const { return {kind(), {}, tokenizer_json()}; }

TokenizerKind byte_bpe_kind() {
  TokenizerKind k;
  k.name = "byte_bpe";
  k.summary = "byte-level BPE, GPT-2's (Radford et al. 2019), read from data.tokenizer_path: a directory with vocab.json "
              "and merges.txt, or a tokenizer.json; ids as transformers gives them";
  k.check = [](const TokenizerOptions& o) {
    TAPEFORMER_CHECK(!o.path.empty(), "data.tokenizer \"byte_bpe\" reads an existing vocabulary: set data.tokenizer_path "
                                      "to a directory with vocab.json and merges.txt (or tokenizer.json), or to a tokenizer.json");
    TAPEFORMER_CHECK(o.vocab_size == 0, "data.vocab_size is ", o.vocab_size, " but data.tokenizer_path '", o.path,
                     "' already fixes the vocabulary: leave data.vocab_size at 0");
  };
  k.build = [](const TokenizerOptions& o, const CorpusText&) -> std::unique_ptr<Tokenizer> {
    return ByteBpeTokenizer::read(o.path);
  };
  k.restore = [](const TokenizerState& s) -> std::unique_ptr<Tokenizer> {
    return ByteBpeTokenizer::from_tokenizer_json(s.model, "the checkpoint's byte_bpe tokenizer");
  };
  return k;
}

}  // namespace tapeformer
