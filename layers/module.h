// Module: named parameters, buffers and child modules, train/eval mode, and
// state save/load by dotted name.
//
//   struct Mlp : Module {
//     Mlp(int64_t c, Rng& rng) {
//       fc = register_module("fc", std::make_shared<Linear>(c, 4 * c, true, rng));
//       proj = register_module("proj", std::make_shared<Linear>(4 * c, c, true, rng));
//     }
//     Var forward(const Var& x) const { return proj->forward(gelu(fc->forward(x))); }
//     std::shared_ptr<Linear> fc, proj;
//   };
//   mlp.named_parameters();   // {"fc.weight", ...}, {"fc.bias", ...}, {"proj.weight", ...}, ...
//
// Names are dotted paths ("0.attn.qkv.weight": TransformerLM registers its
// block stack inline, the stack its layers as "0", "1", ...) in registration order:
// a module's own parameters first, then each child's. They are the checkpoint
// keys and select weight-decay groups. A parameter registered twice (weight
// tying) is listed once, under its first name. Forward signatures are the
// modules' own (no virtual forward).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <functional>
#include <vector>

#include "tapeformer/autograd/var.h"

namespace tapeformer {

class Module {
 public:
  virtual ~Module() = default;

  NamedVars named_parameters() const;
  std::vector<Var> parameters() const;
  NamedTensors named_buffers() const;
  int64_t num_parameters() const;

  // Switches this module and all children between training and evaluation
  // (dropout is off in eval).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Calls f on this module and every descendant, parents first (a program
  // that adjusts layers of one kind: dynamic_cast<LSHAttention*>(&m)).
  void visit(const std::function<void(Module&)>& f);

  // Parameters and buffers by name (values, not copies: the tensors alias
  // the module's storage).
  NamedTensors state() const;
  // Copies values into the module's parameters/buffers. Every name must be
  // present with the same shape and no extra names are allowed; the error
  // names the key and both shapes.
  void load_state(const NamedTensors& state);

  // Makes this module a replica of `source` (same architecture): each of its
  // parameters now reads and writes the source's parameter value (same
  // storage, so optimizer updates of the source are seen at once), while
  // keeping its own node and gradient. Buffers are copied. Replicas let
  // several threads run forward + backward on different data at the same time
  // (train/data_parallel.h). Names and shapes must match; the error names the
  // first mismatch.
  void alias_parameters(const Module& source);
  // Copies the source's buffer values into this module's (same architecture;
  // the error names the first mismatch): replicas catch up with state a
  // layer changed between steps.
  void copy_buffers_from(const Module& source);

  // Tells this module and its children that the optimizer made its step
  // number `step` (1, 2, ...; train_step calls it on the model): a layer whose
  // state moves between steps (random features redrawn, spans clamped)
  // overrides after_optimizer_step. Returns whether any layer changed a
  // buffer (then data-parallel replicas copy the buffers).
  bool optimizer_stepped(int64_t step);

  // Batch statistics: sums a layer adds up over the training forwards of a
  // step (Routing attention's per-cluster sums of its queries), read by its
  // after_optimizer_step. A data-parallel run sums every shard's and rank's
  // into the model's in the fixed shard tree first (train/data_parallel.h),
  // so they are those of the whole batch whatever the shard count; the layer
  // zeroes them when it has used them. Not part of state(): zero between
  // steps, when checkpoints are written.
  NamedTensors statistics() const;  // every module's, by dotted name
  void zero_statistics();

  // Auxiliary losses, the one channel every layer adds to what the trainer
  // backpropagates: the sum of every module's own_auxiliary_loss(of_batch),
  // undefined when no module has one. Terms of the batch (of_batch = true:
  // the learned compression's reconstruction loss of the segment just read)
  // are weighed like the LM loss of the rows they came from, so each
  // data-parallel shard adds its own; the other terms depend on the
  // parameters alone (adaptive span's span penalty) and are added once per
  // step.
  Var auxiliary_loss(bool of_batch) const;
  // Replaces the child registered as `name` by `module`, in the same place
  // among the children (so the parameters keep their order): a wrapper of
  // a layer, such as the Memorizing Transformer's around an attention.
  void replace_module(const std::string& name, std::shared_ptr<Module> module);
  // Per-layer figures a run logs on evaluation steps (adaptive span: its spans),
  // by dotted module name ("0.attn.spans"); layers override own_metrics.
  std::vector<std::pair<std::string, std::vector<double>>> layer_metrics() const;

 protected:
  // Returns true when it changed a buffer (a parameter needs no report:
  // replicas share parameters).
  virtual bool after_optimizer_step(int64_t /*step*/) { return false; }
  virtual Var own_auxiliary_loss(bool /*of_batch*/) const { return Var(); }
  virtual std::vector<std::pair<std::string, std::vector<double>>> own_metrics() const { return {}; }
  Var register_parameter(const std::string& name, Tensor value);
  // Registers an existing Var (e.g. a tied weight owned by another module).
  Var register_parameter(const std::string& name, const Var& var);
  Tensor register_buffer(const std::string& name, Tensor value);
  Tensor register_statistic(const std::string& name, const Shape& shape);  // zeros, see statistics()
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // A child whose entries are named as if they were this module's own
  // (TransformerLM's block stack: "0.attn.qkv.weight", not "stack.0...").
  // Its names must not clash with this module's; a clash is an Error.
  template <class M>
  std::shared_ptr<M> register_inline(std::shared_ptr<M> module) {
    add_child("", module);
    return module;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  bool has_name(const std::string& name) const;  // own, or an inline child's
  void collect(const std::string& prefix, NamedVars& params, NamedTensors& buffers) const;

  NamedVars params_;
  NamedTensors buffers_;
  NamedTensors statistics_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace tapeformer
