// Registry: the one table of named kinds of a family (attention kinds,
// positional schemes, ...), so that a family grows by adding an entry, never
// by editing a switch.
//
//   struct ShapeKind { std::string name; std::string summary; std::function<double(double)> area; };
//   Registry<ShapeKind>& shapes() {
//     static Registry<ShapeKind> r("model.shape", {{"square", "w^2", [](double w) { return w * w; }}});
//     return r;
//   }
//   shapes().add({"circle", "pi r^2", ...});       // a user's own kind, at startup
//   shapes().get("circle").area(2.0);
//   shapes().get("hexagon");   // Error: model.shape: unknown kind "hexagon" (known: square, circle)
//
// Kind is any struct with `std::string name`. Entries keep the order they
// were added in (built-ins first). add() and get() are meant for program
// start-up and configuration, not for concurrent use with each other.
#pragma once

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/core/error.h"

namespace tapeformer {

template <class Kind>
class Registry {
 public:
  // `key` names the family in errors: the config key that selects a kind.
  Registry(std::string key, std::vector<Kind> builtins) : key_(std::move(key)) {
    for (Kind& k : builtins) add(std::move(k));
  }

  // Adds a kind; throws Error if its name is empty or already taken.
  const Kind& add(Kind kind) {
    TAPEFORMER_CHECK(!kind.name.empty(), key_, ": a kind needs a name");
    TAPEFORMER_CHECK(find(kind.name) == nullptr, key_, ": a kind named \"", kind.name, "\" is already registered");
    kinds_.push_back(std::move(kind));
    return kinds_.back();
  }

  // The kind called `name`, or nullptr.
  const Kind* find(const std::string& name) const {
    for (const Kind& k : kinds_)
      if (k.name == name) return &k;
    return nullptr;
  }
  // The kind called `name`; Error naming the key and the known kinds otherwise.
  const Kind& get(const std::string& name) const {
    if (const Kind* k = find(name)) return *k;
    fail(key_, ": unknown kind \"", name, "\" (known: ", names(), ")");
  }

  // Entries in a deque: references returned by add() and get() stay valid.
  const std::deque<Kind>& kinds() const { return kinds_; }
  const std::string& key() const { return key_; }
  // "softmax, linear"
  std::string names() const {
    std::string out;
    for (const Kind& k : kinds_) out += (out.empty() ? "" : ", ") + k.name;
    return out;
  }

 private:
  std::string key_;
  std::deque<Kind> kinds_;
};

}  // namespace tapeformer
