#include "tapeformer/autograd/tape.h"

#include "tapeformer/core/error.h"
#include "tapeformer/core/profile.h"
#include "tapeformer/core/kernels/elementwise.h"

namespace tapeformer {
namespace {
thread_local Tape t_default_tape;
thread_local Tape* t_current = nullptr;
thread_local bool t_enabled = true;
}  // namespace

Tape& current_tape() { return t_current ? *t_current : t_default_tape; }
bool grad_enabled() { return t_enabled; }

NoGradGuard::NoGradGuard() : previous_(t_enabled) { t_enabled = false; }
NoGradGuard::~NoGradGuard() { t_enabled = previous_; }

TapeScope::TapeScope() : previous_tape_(t_current), previous_enabled_(t_enabled) {
  t_current = &tape_;
  t_enabled = true;
}
TapeScope::~TapeScope() {
  t_current = previous_tape_;
  t_enabled = previous_enabled_;
}

void Tape::run_backward() {
  // Take the entries out first: a custom backward may open its own TapeScope,
  // and this tape must be empty (and reusable) once we return, even on error.
  std::vector<Entry> entries = std::move(entries_);
  entries_.clear();
  NoGradGuard no_grad;
  const profile::BackwardPass timed_as_backward;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    (*it)();
    *it = nullptr;  // free this entry's saved tensors now
  }
}

void backward(const Var& loss) {
  TAPEFORMER_CHECK(loss.defined(), "backward: loss is undefined");
  TAPEFORMER_CHECK(loss.numel() == 1, "backward: loss must hold one element, got shape ",
                   loss.shape(), "; pass a seed gradient for non-scalar outputs");
  backward(std::vector<Var>{loss}, std::vector<Tensor>{Tensor::ones(loss.shape())});
}

void backward(const Var& output, const Tensor& seed) {
  backward(std::vector<Var>{output}, std::vector<Tensor>{seed});
}

void backward(const std::vector<Var>& outputs, const std::vector<Tensor>& seeds) {
  TAPEFORMER_CHECK(outputs.size() == seeds.size(), "backward: ", outputs.size(), " outputs but ",
                   seeds.size(), " seed gradients");
  bool any = false;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Var& out = outputs[i];
    TAPEFORMER_CHECK(out.defined(), "backward: output ", i, " is undefined");
    TAPEFORMER_CHECK(seeds[i].defined() && seeds[i].shape() == out.shape(), "backward: seed ", i,
                     " has shape ", seeds[i], " but output has shape ", out.shape());
    if (!out.requires_grad()) continue;
    accumulate_grad(out, seeds[i], "backward");
    any = true;
  }
  TAPEFORMER_CHECK(any, "backward: no output requires grad (no input required grad, or it was "
                        "computed under NoGradGuard)");
  current_tape().run_backward();
}

void accumulate_grad(const Var& v, const Tensor& g, const char* op) {
  if (!v.requires_grad()) return;
  TAPEFORMER_CHECK(g.defined() && g.shape() == v.shape(), op, ": gradient of shape ", g,
                   " does not match input of shape ", v.shape(),
                   v.name().empty() ? "" : " ('", v.name(), v.name().empty() ? "" : "')");
  Node* n = v.node();
  if (!n->grad.defined()) {
    // Take the buffer when nobody else can see it; otherwise copy, because the
    // accumulator adds into grad in place later.
    const bool owned = g.is_contiguous() && g.storage().use_count() == 1 && g.offset() == 0 &&
                       g.storage()->size() == g.numel();
    n->grad = owned ? g : g.clone();
  } else {
    kernels::add_inplace(n->grad, g);
  }
}

Var make_result(Tensor value, std::initializer_list<const Var*> inputs) {
  bool requires = false;
  if (grad_enabled()) {
    for (const Var* v : inputs) requires = requires || v->requires_grad();
  }
  return Var(std::move(value), requires);
}

Var::Var(Tensor value, bool requires_grad, std::string name)
    : node_(std::make_shared<Node>(Node{std::move(value), Tensor(), requires_grad, std::move(name)})) {}

}  // namespace tapeformer
