#include "tapeformer/layers/module.h"

#include <algorithm>
#include <set>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"

namespace tapeformer {

bool Module::has_name(const std::string& name) const {
  for (const auto& p : params_)
    if (p.first == name) return true;
  for (const auto& b : buffers_)
    if (b.first == name) return true;
  for (const auto& b : statistics_)
    if (b.first == name) return true;
  for (const auto& c : children_)
    if (c.first == name || (c.first.empty() && c.second->has_name(name))) return true;
  return false;
}

void Module::check_new_name(const std::string& name) const {
  TAPEFORMER_CHECK(!name.empty() && name.find('.') == std::string::npos,
                   "Module: invalid name '", name, "' (non-empty, no dots)");
  TAPEFORMER_CHECK(!has_name(name), "Module: duplicate name '", name, "'");
}

Var Module::register_parameter(const std::string& name, Tensor value) {
  return register_parameter(name, Var(std::move(value), true, name));
}

Var Module::register_parameter(const std::string& name, const Var& var) {
  check_new_name(name);
  TAPEFORMER_CHECK(var.defined(), "Module: parameter '", name, "' is undefined");
  var.set_requires_grad(true);
  params_.emplace_back(name, var);
  return var;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  buffers_.emplace_back(name, value);
  return value;
}

Tensor Module::register_statistic(const std::string& name, const Shape& shape) {
  check_new_name(name);
  Tensor t = Tensor::zeros(shape);
  statistics_.emplace_back(name, t);
  return t;
}

NamedTensors Module::statistics() const {
  NamedTensors all;
  for (const auto& [name, t] : statistics_) all.emplace_back(name, t);
  for (const auto& [name, child] : children_)
    for (auto& [n, t] : child->statistics()) all.emplace_back(name.empty() ? n : name + "." + n, t);
  return all;
}

void Module::zero_statistics() {
  for (auto& [name, t] : statistics()) t.fill(0);
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  TAPEFORMER_CHECK(module != nullptr, "Module: the replacement of child '", name, "' is null");
  for (auto& [n, child] : children_) {
    if (n != name) continue;
    module->train(child->is_training());
    child = std::move(module);
    return;
  }
  fail("Module: no child '", name, "' to replace");
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  TAPEFORMER_CHECK(module != nullptr, "Module: child '", name, "' is null");
  if (name.empty()) {  // inline: its names join this module's
    for (const auto& p : module->params_) check_new_name(p.first);
    for (const auto& b : module->buffers_) check_new_name(b.first);
    for (const auto& c : module->children_)
      if (!c.first.empty()) check_new_name(c.first);
  } else {
    check_new_name(name);
  }
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, NamedVars& params, NamedTensors& buffers) const {
  for (const auto& [name, var] : params_) params.emplace_back(prefix + name, var);
  for (const auto& [name, t] : buffers_) buffers.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(name.empty() ? prefix : prefix + name + ".", params, buffers);
}

NamedVars Module::named_parameters() const {
  NamedVars all, unique;
  NamedTensors buffers;
  collect("", all, buffers);
  std::set<const Node*> seen;  // tied weights appear once, under their first name
  for (auto& p : all)
    if (seen.insert(p.second.node()).second) unique.push_back(std::move(p));
  return unique;
}

std::vector<Var> Module::parameters() const {
  std::vector<Var> out;
  for (auto& p : named_parameters()) out.push_back(p.second);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedVars params;
  NamedTensors buffers;
  collect("", params, buffers);
  return buffers;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) n += p.second.numel();
  return n;
}

void Module::visit(const std::function<void(Module&)>& f) {
  f(*this);
  for (auto& c : children_) c.second->visit(f);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

NamedTensors Module::state() const {
  NamedTensors out;
  for (const auto& [name, var] : named_parameters()) out.emplace_back(name, var.value());
  for (auto& b : named_buffers()) out.push_back(std::move(b));
  return out;
}

void Module::load_state(const NamedTensors& state) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) {
    TAPEFORMER_CHECK(given.emplace(name, &t).second, "load_state: duplicate key '", name, "'");
  }
  NamedTensors mine = this->state();
  for (auto& [name, dst] : mine) {
    auto it = given.find(name);
    TAPEFORMER_CHECK(it != given.end(), "load_state: missing key '", name, "' (shape ", dst.shape(), ")");
    TAPEFORMER_CHECK(it->second->shape() == dst.shape(), "load_state: key '", name, "' has shape ",
                     it->second->shape(), " but the model expects ", dst.shape());
  }
  for (const auto& [name, t] : state) {
    bool known = false;
    for (const auto& m : mine) known = known || m.first == name;
    TAPEFORMER_CHECK(known, "load_state: unexpected key '", name, "' (shape ", t.shape(), ")");
  }
  for (auto& [name, dst] : mine) dst.copy_from(*given[name]);
}

void Module::alias_parameters(const Module& source) {
  TAPEFORMER_CHECK(&source != this, "alias_parameters: a module cannot alias itself");
  const NamedVars mine = named_parameters(), theirs = source.named_parameters();
  for (size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    TAPEFORMER_CHECK(i < mine.size() && i < theirs.size() && mine[i].first == theirs[i].first,
                     "alias_parameters: parameter ", i, " is '", i < mine.size() ? mine[i].first : "(none)",
                     "' here but '", i < theirs.size() ? theirs[i].first : "(none)", "' in the source");
    TAPEFORMER_CHECK(mine[i].second.shape() == theirs[i].second.shape(), "alias_parameters: '", mine[i].first,
                     "' has shape ", mine[i].second.shape(), " here but ", theirs[i].second.shape(),
                     " in the source");
  }
  copy_buffers_from(source);
  for (size_t i = 0; i < mine.size(); ++i) {
    Node* n = mine[i].second.node();
    n->value = theirs[i].second.value();
    n->grad = Tensor();
  }
}

void Module::copy_buffers_from(const Module& source) {
  const NamedTensors my_buffers = named_buffers(), their_buffers = source.named_buffers();
  TAPEFORMER_CHECK(my_buffers.size() == their_buffers.size(), "copy_buffers_from: ", my_buffers.size(),
                   " buffers here but ", their_buffers.size(), " in the source");
  for (size_t i = 0; i < my_buffers.size(); ++i)
    TAPEFORMER_CHECK(my_buffers[i].first == their_buffers[i].first &&
                         my_buffers[i].second.shape() == their_buffers[i].second.shape(),
                     "copy_buffers_from: buffer '", my_buffers[i].first, "' does not match the source's '",
                     their_buffers[i].first, "'");
  for (size_t i = 0; i < my_buffers.size(); ++i) {
    Tensor dst = my_buffers[i].second;
    dst.copy_from(their_buffers[i].second);
  }
}

Var Module::auxiliary_loss(bool of_batch) const {
  Var total = own_auxiliary_loss(of_batch);
  for (const auto& c : children_) {
    const Var v = c.second->auxiliary_loss(of_batch);
    if (v.defined()) total = total.defined() ? add(total, v) : v;
  }
  return total;
}

std::vector<std::pair<std::string, std::vector<double>>> Module::layer_metrics() const {
  std::vector<std::pair<std::string, std::vector<double>>> out = own_metrics();
  for (const auto& [name, child] : children_)
    for (auto& [key, values] : child->layer_metrics())
      out.emplace_back(name.empty() ? key : name + "." + key, std::move(values));
  return out;
}

bool Module::optimizer_stepped(int64_t step) {
  bool changed = after_optimizer_step(step);
  for (auto& c : children_) changed = c.second->optimizer_stepped(step) || changed;
  return changed;
}

}  // namespace tapeformer
