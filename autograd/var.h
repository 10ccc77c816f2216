// Var: a cheap handle to an autograd node (value, lazily allocated grad,
// requires_grad, name). Copies alias the same node.
//
//   Var w(Tensor::zeros({4, 3}), /*requires_grad=*/true, "w");
//   Var y = matmul(x, w);        // recorded on the current tape
//   backward(sum(y));            // fills w.grad()
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/core/tensor.h"

namespace tapeformer {

struct Node {
  Tensor value;
  Tensor grad;  // undefined until a gradient arrives
  bool requires_grad = false;
  std::string name;
  // Set by an op whose output is cheap to compute again (autograd/rebuild.h):
  // gives `value` again, bit for bit, once it has been released.
  std::function<Tensor()> rebuild;
};

class Var {
 public:
  Var() = default;
  explicit Var(Tensor value, bool requires_grad = false, std::string name = {});

  bool defined() const { return node_ != nullptr; }
  // A released value (autograd/rebuild.h) is rebuilt here and kept again.
  const Tensor& value() const {
    if (!node_->value.defined() && node_->rebuild) restore();
    return node_->value;
  }
  // Mutable value for in-place parameter updates (optimizers, loading).
  Tensor& value() {
    if (!node_->value.defined() && node_->rebuild) restore();
    return node_->value;
  }
  // The value for one use: a released value is rebuilt for the caller and
  // not kept (a backward that reads it once).
  Tensor value_once() const;
  // Whether the value may be released and rebuilt (autograd/rebuild.h).
  bool rebuildable() const { return node_ && node_->rebuild != nullptr; }
  const Tensor& grad() const { return node_->grad; }
  // The gradient made contiguous in place first, for passes that walk its
  // buffer (clipping, optimizer steps, shard reduction). Requires has_grad().
  Tensor& dense_grad() const {
    if (!node_->grad.is_contiguous()) node_->grad = node_->grad.contiguous();
    return node_->grad;
  }
  bool has_grad() const { return node_ && node_->grad.defined(); }
  // Drops the gradient (the next backward allocates a fresh one).
  void zero_grad() const { node_->grad = Tensor(); }
  bool requires_grad() const { return node_ && node_->requires_grad; }
  void set_requires_grad(bool r) const { node_->requires_grad = r; }
  const std::string& name() const { return node_->name; }
  void set_name(std::string n) const { node_->name = std::move(n); }

  const Shape& shape() const { return node_->value.shape(); }
  int rank() const { return node_->value.rank(); }
  int64_t dim(int i) const { return node_->value.dim(i); }
  int64_t numel() const { return node_->value.numel(); }
  Scalar item() const { return value().item(); }

  Node* node() const { return node_.get(); }
  bool same_node(const Var& other) const { return node_ == other.node_; }

 private:
  void restore() const;
  std::shared_ptr<Node> node_;
};

// Named collections: parameters and state by dotted name ("0.attn.qkv.weight").
using NamedVars = std::vector<std::pair<std::string, Var>>;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

}  // namespace tapeformer
