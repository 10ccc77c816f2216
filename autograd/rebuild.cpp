#include "tapeformer/autograd/rebuild.h"

#include <vector>

#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {
thread_local std::vector<Var>* t_marked = nullptr;  // the innermost scope's rebuildable outputs
}  // namespace

void Var::restore() const { node_->value = node_->rebuild(); }

Tensor Var::value_once() const {
  if (node_->value.defined() || !node_->rebuild) return node_->value;
  return node_->rebuild();
}

bool releasing() { return t_marked != nullptr && grad_enabled(); }

void mark_rebuildable(const Var& out, std::function<Tensor()> rebuild) {
  TAPEFORMER_CHECK(rebuild != nullptr, "mark_rebuildable: no rebuild function given");
  if (!releasing() || !out.requires_grad()) return;
  out.node()->rebuild = std::move(rebuild);
  t_marked->push_back(out);
}

Var release_rebuildable(const std::function<Var()>& fn) {
  std::vector<Var> marked;
  std::vector<Var>* outer = t_marked;
  t_marked = &marked;
  Var result;
  try {
    result = fn();
  } catch (...) {
    t_marked = outer;
    throw;
  }
  t_marked = outer;
  for (const Var& v : marked) {
    if (result.defined() && v.same_node(result)) continue;
    Node* n = v.node();
    if (n->value.defined()) n->value = n->value.shape_only();
  }
  return result;
}

}  // namespace tapeformer
