#include "tapeformer/data/nanogpt_meta.h"

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <variant>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/data/utf8.h"

namespace tapeformer {
namespace {

constexpr size_t kMaxMetaBytes = size_t{64} << 20;

struct Value;
using Dict = std::vector<std::pair<Value, Value>>;
struct Mark {};
struct None {};
// A pickled value of the kinds nanoGPT's meta holds; dicts are shared so that
// the memo and the stack see one object, as in Python.
struct Value {
  std::variant<None, Mark, bool, int64_t, std::string, std::shared_ptr<Dict>> v;
};

// The pickle machine, for the opcodes of a dict of ints and strings.
class Unpickler {
 public:
  Unpickler(const std::string& bytes, const std::string& origin) : b_(bytes), origin_(origin) {}

  Value run() {
    while (true) {
      const size_t at = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      switch (op) {
        case 0x80: take(1); break;                   // PROTO
        case 0x95: take(8); break;                   // FRAME (a length hint)
        case '}': push(std::make_shared<Dict>()); break;  // EMPTY_DICT
        case '(': push(Mark{}); break;               // MARK
        case 'N': push(None{}); break;
        case 0x88: push(true); break;                // NEWTRUE
        case 0x89: push(false); break;               // NEWFALSE
        case 'K': push(static_cast<int64_t>(uint_le(1))); break;  // BININT1
        case 'M': push(static_cast<int64_t>(uint_le(2))); break;  // BININT2
        case 'J': push(static_cast<int64_t>(static_cast<int32_t>(uint_le(4)))); break;  // BININT
        case 0x8a: push(long1()); break;             // LONG1
        case 0x8c: push(text(uint_le(1))); break;    // SHORT_BINUNICODE
        case 'X': push(text(uint_le(4))); break;     // BINUNICODE
        case 0x8d: push(text(uint_le(8))); break;    // BINUNICODE8
        case 0x94: memo_[memo_.size()] = top(); break;  // MEMOIZE
        case 'q': memo_[uint_le(1)] = top(); break;  // BINPUT
        case 'r': memo_[uint_le(4)] = top(); break;  // LONG_BINPUT
        case 'h': push(recall(uint_le(1), at)); break;  // BINGET
        case 'j': push(recall(uint_le(4), at)); break;  // LONG_BINGET
        case 's': {                                  // SETITEM
          Value value = pop(), key = pop();
          dict_below(at).push_back({std::move(key), std::move(value)});
          break;
        }
        case 'u': {                                  // SETITEMS
          std::vector<Value> items = pop_to_mark(at);
          TAPEFORMER_CHECK(items.size() % 2 == 0, origin_, ": SETITEMS at byte ", at, " with an odd number of items");
          Dict& d = dict_below(at);
          for (size_t i = 0; i < items.size(); i += 2) d.push_back({std::move(items[i]), std::move(items[i + 1])});
          break;
        }
        case '.':                                    // STOP
          TAPEFORMER_CHECK(stack_.size() == 1, origin_, ": STOP at byte ", at, " with ", stack_.size(),
                           " values on the stack");
          return pop();
        default:
          fail(origin_, ": pickle opcode ", hex_byte(op), " at byte ", at,
               " is not one nanoGPT's meta.pkl uses (a dict of ints and strings); not read");
      }
    }
  }

 private:
  std::string_view take(size_t n) {
    TAPEFORMER_CHECK(n <= b_.size() - pos_, origin_, ": truncated (", b_.size(), " bytes, needs ", n, " more at byte ",
                     pos_, ")");
    const std::string_view s(b_.data() + pos_, n);
    pos_ += n;
    return s;
  }
  uint64_t uint_le(size_t n) {
    const std::string_view s = take(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
    return v;
  }
  int64_t long1() {
    const size_t n = static_cast<size_t>(uint_le(1));
    TAPEFORMER_CHECK(n <= 8, origin_, ": an integer of ", n, " bytes at byte ", pos_, " is too large");
    if (n == 0) return 0;
    const uint64_t v = uint_le(n);
    const int shift = static_cast<int>(64 - 8 * n);
    return static_cast<int64_t>(v << shift) >> shift;  // sign-extend
  }
  std::string text(uint64_t n) {
    TAPEFORMER_CHECK(n <= b_.size(), origin_, ": a string of ", n, " bytes at byte ", pos_, " in a file of ", b_.size());
    std::string s(take(static_cast<size_t>(n)));
    const size_t bad = utf8_error_offset(s);
    TAPEFORMER_CHECK(bad == std::string::npos, origin_, ": a string at byte ", pos_ - n, " is not valid UTF-8");
    return s;
  }
  void push(Value v) { stack_.push_back(std::move(v)); }
  template <class T>
  void push(T v) {
    stack_.push_back(Value{std::move(v)});
  }
  const Value& top() const {
    TAPEFORMER_CHECK(!stack_.empty(), origin_, ": memoize with an empty stack at byte ", pos_ - 1);
    return stack_.back();
  }
  Value pop() {
    TAPEFORMER_CHECK(!stack_.empty(), origin_, ": the stack runs empty at byte ", pos_ - 1);
    Value v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  Value recall(uint64_t slot, size_t at) {
    const auto it = memo_.find(slot);
    TAPEFORMER_CHECK(it != memo_.end(), origin_, ": memo slot ", slot, " read at byte ", at, " was never written");
    // Each recall copies a string: bounded, so a small file cannot ask for gigabytes.
    if (const auto* s = std::get_if<std::string>(&it->second.v)) {
      copied_ += s->size();
      TAPEFORMER_CHECK(copied_ <= kMaxMetaBytes, origin_, ": recalls strings of more than ", kMaxMetaBytes >> 20,
                       " MiB in all: not a vocabulary");
    }
    return it->second;
  }
  std::vector<Value> pop_to_mark(size_t at) {
    std::vector<Value> items;
    while (true) {
      TAPEFORMER_CHECK(!stack_.empty(), origin_, ": no MARK before byte ", at);
      Value v = pop();
      if (std::holds_alternative<Mark>(v.v)) break;
      items.push_back(std::move(v));
    }
    return {items.rbegin(), items.rend()};
  }
  Dict& dict_below(size_t at) {
    TAPEFORMER_CHECK(!stack_.empty() && std::holds_alternative<std::shared_ptr<Dict>>(stack_.back().v), origin_,
                     ": items set at byte ", at, " on something that is not a dict");
    return *std::get<std::shared_ptr<Dict>>(stack_.back().v);
  }

  const std::string& b_;
  const std::string& origin_;
  size_t pos_ = 0;
  size_t copied_ = 0;
  std::vector<Value> stack_;
  std::map<uint64_t, Value> memo_;
};

const Value* lookup(const Dict& d, const std::string& key) {
  for (const auto& [k, v] : d)
    if (const auto* s = std::get_if<std::string>(&k.v); s != nullptr && *s == key) return &v;
  return nullptr;
}

}  // namespace

std::unique_ptr<Tokenizer> read_nanogpt_meta(const std::string& path) {
  const std::string origin = "nanoGPT meta file '" + path + "'";
  check_regular_file(path, "nanoGPT meta file");
  std::ifstream in(path, std::ios::binary);
  TAPEFORMER_CHECK(in.good(), origin, ": cannot open");
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string bytes = buf.str();
  TAPEFORMER_CHECK(!bytes.empty(), origin, " is empty");
  TAPEFORMER_CHECK(bytes.size() <= kMaxMetaBytes, origin, " is larger than ", kMaxMetaBytes >> 20,
                   " MiB: not a vocabulary");
  const Value top = Unpickler(bytes, origin).run();
  const auto* meta = std::get_if<std::shared_ptr<Dict>>(&top.v);
  TAPEFORMER_CHECK(meta != nullptr, origin, " does not hold a dict");
  const Value* itos = lookup(**meta, "itos");
  const auto* table = itos ? std::get_if<std::shared_ptr<Dict>>(&itos->v) : nullptr;
  TAPEFORMER_CHECK(table != nullptr, origin, " has no 'itos' dict (nanoGPT writes one for char-level data only)");
  const size_t n = (*table)->size();
  TAPEFORMER_CHECK(n > 0, origin, ": 'itos' is empty");
  std::vector<uint32_t> vocab(n, 0);
  std::vector<bool> seen(n, false);
  for (const auto& [k, v] : **table) {
    const auto* id = std::get_if<int64_t>(&k.v);
    const auto* ch = std::get_if<std::string>(&v.v);
    TAPEFORMER_CHECK(id != nullptr && ch != nullptr, origin, ": 'itos' must map ints to strings");
    TAPEFORMER_CHECK(*id >= 0 && static_cast<size_t>(*id) < n && !seen[static_cast<size_t>(*id)], origin,
                     ": 'itos' ids must be 0..", n - 1, " once each, got ", *id);
    const std::vector<uint32_t> cps = utf8_decode(*ch);
    TAPEFORMER_CHECK(cps.size() == 1, origin, ": 'itos'[", *id, "] is \"", *ch, "\", not one character");
    vocab[static_cast<size_t>(*id)] = cps[0];
    seen[static_cast<size_t>(*id)] = true;
  }
  if (const Value* size = lookup(**meta, "vocab_size")) {
    const auto* count = std::get_if<int64_t>(&size->v);
    TAPEFORMER_CHECK(count != nullptr && *count == static_cast<int64_t>(n), origin,
                     ": 'vocab_size' disagrees with the ", n, " entries of 'itos'");
  }
  for (size_t i = 1; i < n; ++i)
    TAPEFORMER_CHECK(vocab[i - 1] < vocab[i], origin, ": 'itos' is not in code point order at id ", i,
                     " (nanoGPT's prepare.py sorts the characters; this vocabulary came from elsewhere)");
  return std::make_unique<CharTokenizer>(std::move(vocab));
}

}  // namespace tapeformer
