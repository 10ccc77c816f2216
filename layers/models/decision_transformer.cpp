#include "tapeformer/layers/models/decision_transformer.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/layers/memory/memory.h"

namespace tapeformer {

namespace {

void check_config(const ModelConfig& cfg) {
  for (const MemoryKind* k : memories_on(cfg))
    TAPEFORMER_CHECK(k->name == "xl", "model.arch \"decision_transformer\" carries Transformer-XL's segment memory "
                     "(model.mem_len) and no other; memory \"", k->name, "\" is on (set model.", k->options[0].name,
                     " = 0)");
  TAPEFORMER_CHECK(cfg.option_int("ext_len") == 0, "model.arch \"decision_transformer\" reads each segment of steps "
                   "once: model.ext_len must be 0, got ", cfg.option_int("ext_len"));
  TAPEFORMER_CHECK(cfg.vocab_size >= 1, "model.arch \"decision_transformer\": model.vocab_size is the number of "
                                        "actions and must be >= 1, got ", cfg.vocab_size);
  DecisionTransformer::state_sizes(cfg);
  const double scale = cfg.option_number("dt_return_scale");
  TAPEFORMER_CHECK(std::isfinite(scale) && scale > 0, "model.dt_return_scale must be a number > 0, got ", scale);
  const int64_t t = cfg.option_int("dt_max_timestep");
  TAPEFORMER_CHECK(t >= 1 && t <= (int64_t{1} << 24), "model.dt_max_timestep must be in [1, 2^24], got ", t);
}

// Feature f of states (B, K, F) as ids (B, K).
IndexTensor feature(const IndexTensor& states, int64_t f) {
  const int64_t B = states.shape[0], K = states.shape[1], F = states.shape[2];
  std::vector<int32_t> v(static_cast<size_t>(B * K));
  for (int64_t i = 0; i < B * K; ++i) v[static_cast<size_t>(i)] = states.data[static_cast<size_t>(i * F + f)];
  return IndexTensor({B, K}, v);
}

// The state of a model reading step by step: every row's steps so far. A
// memoryless model re-reads the last `window` of them whole for each new
// piece; a model with a segment memory reads the unfinished segment (the
// steps from `committed` on) over the memory of the finished ones, as it
// trained, and the memory moves on when a segment of K steps is complete.
class StepWindow : public InferenceState {
 public:
  std::string name() const override { return "decision-transformer steps"; }
  int64_t length() const override { return length_; }
  void reset() override {
    for (auto& r : rows) r = Row{};
    memory.reset();
    length_ = committed = 0;
  }
  struct Row {
    std::vector<int32_t> ids, states, returns, timesteps;  // per step (states: F per step)
  };
  const DecisionTransformer* owner = nullptr;
  std::vector<Row> rows;
  SegmentMemory memory;  // after the finished segments (a model with model.mem_len)
  int64_t window = 0, length_ = 0, committed = 0;
};

}  // namespace

std::vector<int64_t> DecisionTransformer::state_sizes(const ModelConfig& cfg) {
  const std::string text = cfg.option_string("dt_state_sizes");
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const int64_t v = number_error<int64_t>(item).empty() ? parse_number<int64_t>(item, "") : 0;
    TAPEFORMER_CHECK(v >= 1 && v <= (1 << 24),
                     "model.dt_state_sizes must list each state feature's number of values, e.g. \"36,37\"; got \"",
                     text, "\"");
    sizes.push_back(v);
  }
  TAPEFORMER_CHECK(!sizes.empty() && sizes.size() <= 64, "model.dt_state_sizes must list 1 to 64 features, got \"",
                   text, "\"");
  return sizes;
}

ModelConfig DecisionTransformer::stack_config(const ModelConfig& cfg) {
  ModelConfig c = cfg;
  const int64_t per_step = cfg.option_bool("dt_returns") ? 3 : 2;
  c.block_size = per_step * cfg.block_size;
  if (!memories_on(cfg).empty()) c.options["mem_len"] = per_step * cfg.option_int("mem_len");
  return c;
}

DecisionTransformer::DecisionTransformer(const ModelConfig& cfg, Rng& rng)
    : cfg_(cfg),
      per_step_(cfg.option_bool("dt_returns") ? 3 : 2),
      sizes_(state_sizes(cfg)),
      return_scale_(static_cast<float>(cfg.option_number("dt_return_scale"))),
      max_timestep_(cfg.option_int("dt_max_timestep")) {
  cfg.validate();
  check_config(cfg);
  const ModelConfig inner = stack_config(cfg);
  const int64_t C = cfg.n_embd;
  if (per_step_ == 3) return_emb = register_module("return_emb", std::make_shared<Linear>(1, C, true, rng));
  for (size_t f = 0; f < sizes_.size(); ++f)
    state_emb.push_back(register_module("state_emb_" + std::to_string(f), std::make_shared<Embedding>(sizes_[f], C, rng)));
  action_emb = register_module("action_emb", std::make_shared<Embedding>(cfg.vocab_size + 1, C, rng));
  time_emb = register_module("time_emb", std::make_shared<Embedding>(max_timestep_ + 1, C, rng));
  embed_ln = register_module("embed_ln", std::make_shared<LayerNorm>(C, cfg.bias, cfg.norm_eps));
  pos_emb = register_module("pos_emb", positional_kinds().get(cfg.positional).make(inner, rng));
  drop = register_module("drop", std::make_shared<Dropout>(cfg.dropout));
  stack = register_inline(block_kinds().get(cfg.block).make(inner, *pos_emb, rng));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(C, cfg.bias, cfg.norm_eps));
  head = register_module("head", std::make_shared<Linear>(C, cfg.vocab_size, false, rng));
}

ModelFootprint DecisionTransformer::footprint(const ModelConfig& cfg) {
  cfg.validate_kinds();
  check_config(cfg);
  const ModelConfig inner = stack_config(cfg);
  const double C = static_cast<double>(cfg.n_embd), A = static_cast<double>(cfg.vocab_size), b = cfg.bias ? 1 : 0;
  double states = 0;
  for (int64_t s : state_sizes(cfg)) states += static_cast<double>(s);
  ModelFootprint f;
  f.parameters = (cfg.option_bool("dt_returns") ? 2 * C : 0) + states * C + (A + 1) * C +
                 static_cast<double>(cfg.option_int("dt_max_timestep") + 1) * C + 2 * (C + b * C) /* embed_ln, ln_f */ +
                 positional_kinds().get(cfg.positional).parameters(inner) + block_kinds().get(cfg.block).parameters(inner) +
                 C * A;
  return f;
}

Var DecisionTransformer::tokens(const IndexTensor& ids, const ModelInputs& inputs) const {
  const int64_t B = ids.shape[0], K = ids.shape[1], F = static_cast<int64_t>(sizes_.size());
  const auto input = [&](const char* name, const Shape& shape) -> const IndexTensor& {
    const auto it = inputs.find(name);
    TAPEFORMER_CHECK(it != inputs.end(), "DecisionTransformer: the extra input \"", name, "\" ", shape,
                     " is missing (ModelContext::inputs)");
    TAPEFORMER_CHECK(it->second.shape == shape, "DecisionTransformer: the extra input \"", name, "\" is ",
                     it->second.shape, ", expected ", shape);
    return it->second;
  };
  for (int32_t a : ids.data)
    TAPEFORMER_CHECK(a >= 0 && a <= cfg_.vocab_size, "DecisionTransformer: action id ", a, " is outside 0..",
                     cfg_.vocab_size, " (", cfg_.vocab_size, ": no previous action)");
  const IndexTensor& states = input(kStates, Shape({B, K, F}));
  for (size_t i = 0; i < states.data.size(); ++i) {
    const int64_t f = static_cast<int64_t>(i) % F;
    TAPEFORMER_CHECK(states.data[i] >= 0 && states.data[i] < sizes_[static_cast<size_t>(f)], "DecisionTransformer: "
                     "state feature ", f, " = ", states.data[i], " is outside 0..", sizes_[static_cast<size_t>(f)] - 1,
                     " (model.dt_state_sizes)");
  }
  IndexTensor time = input(kTimesteps, Shape({B, K}));
  for (int32_t& t : time.data) {
    TAPEFORMER_CHECK(t >= 0, "DecisionTransformer: timestep ", t, " is negative");
    t = static_cast<int32_t>(std::min<int64_t>(t, max_timestep_));
  }
  const Var e_t = time_emb->forward(time);  // (B, K, C)
  Var e_s;
  for (int64_t f = 0; f < F; ++f) {
    const Var e = state_emb[static_cast<size_t>(f)]->forward(feature(states, f));
    e_s = e_s.defined() ? add(e_s, e) : e;
  }
  const int64_t C = cfg_.n_embd;
  const auto step_token = [&](const Var& e) { return reshape(add(e, e_t), {B, K, 1, C}); };
  std::vector<Var> parts = {step_token(action_emb->forward(ids))};
  if (return_emb) {
    const IndexTensor& returns = input(kReturns, Shape({B, K}));
    Tensor r = Tensor::empty({B, K, 1});
    for (int64_t i = 0; i < B * K; ++i)
      r.data()[i] = static_cast<Scalar>(static_cast<double>(returns.data[static_cast<size_t>(i)]) / return_scale_);
    parts.push_back(step_token(return_emb->forward(Var(r))));
  }
  parts.push_back(step_token(e_s));
  return embed_ln->forward(reshape(concat(parts, 2), {B, per_step_ * K, C}));  // (B, P K, C)
}

Var DecisionTransformer::actions(const Var& h, int64_t K) const {
  const int64_t B = h.dim(0), C = h.dim(2);
  const Var at_states = reshape(slice(reshape(h, {B, K, per_step_, C}), 2, per_step_ - 1, per_step_), {B, K, C});
  return head->forward(ln_f->forward(at_states));  // (B, K, A)
}

Var DecisionTransformer::forward(const IndexTensor& ids, const ModelContext& ctx) const {
  TAPEFORMER_CHECK(ctx.memory == nullptr || ctx.state == nullptr,
                   "DecisionTransformer: a call reads an inference state or a segment memory, not both");
  TAPEFORMER_CHECK(ctx.memory == nullptr || memory_use().carried(),
                   "DecisionTransformer: a segment memory needs model.mem_len > 0 and a block kind that carries one");
  TAPEFORMER_CHECK(!ctx.features, "model.arch \"decision_transformer\" does not expose its features");
  TAPEFORMER_CHECK(ids.shape.rank() == 2 && ids.shape[1] >= 1, "DecisionTransformer: ids must be (B, K) with K >= 1, "
                   "got ", ids.shape);
  const ModelInputs none;
  const ModelInputs& inputs = ctx.inputs != nullptr ? *ctx.inputs : none;
  if (ctx.state == nullptr) {
    const int64_t K = ids.shape[1];
    TAPEFORMER_CHECK(K <= cfg_.block_size, "DecisionTransformer: a window of ", K, " steps exceeds model.block_size = ",
                     cfg_.block_size);
    TAPEFORMER_CHECK(ctx.rng != nullptr || !is_training() || cfg_.dropout == 0.0f,
                     "DecisionTransformer: training with model.dropout needs an Rng (ModelContext::rng)");
    Rng unused(0);
    Rng& rng = ctx.rng != nullptr ? *ctx.rng : unused;
    const Var x = drop->forward(pos_emb->embed(tokens(ids, inputs), 0), rng);
    if (ctx.memory == nullptr) return actions(stack->forward(x, rng), K);
    TAPEFORMER_CHECK(ctx.memory->batch() == 0 || ctx.memory->batch() == ids.shape[0], "DecisionTransformer: a memory "
                     "of ", ctx.memory->batch(), " sequences for a batch of ", ids.shape[0]);
    return actions(stack->forward(x, *ctx.memory, rng), K);
  }
  StepWindow& s = state_as<StepWindow>(*ctx.state, "DecisionTransformer", "decision-transformer steps");
  TAPEFORMER_CHECK(s.owner == this, "DecisionTransformer: this inference state was made by another model");
  TAPEFORMER_CHECK(!grad_enabled() && !is_training(),
                   "DecisionTransformer: the inference-state forward is for inference (eval() and NoGradGuard)");
  const int64_t B = ids.shape[0], T = ids.shape[1], F = static_cast<int64_t>(sizes_.size());
  TAPEFORMER_CHECK(B == static_cast<int64_t>(s.rows.size()), "DecisionTransformer: ids ", ids.shape, " for a state of ",
                   s.rows.size(), " sequences");
  const auto column = [&](const char* name, int64_t width) -> const IndexTensor& {
    const auto it = inputs.find(name);
    TAPEFORMER_CHECK(it != inputs.end() && it->second.numel() == B * T * width, "DecisionTransformer: the extra input \"",
                     name, "\" of the ", T, " new steps is missing or not (", B, ", ", T, width > 1 ? ", F)" : ")");
    return it->second;
  };
  const IndexTensor& states = column(kStates, F);
  const IndexTensor& time = column(kTimesteps, 1);
  const IndexTensor* returns = return_emb ? &column(kReturns, 1) : nullptr;
  for (int64_t b = 0; b < B; ++b) {
    StepWindow::Row& row = s.rows[static_cast<size_t>(b)];
    for (int64_t t = 0; t < T; ++t) {
      const auto i = static_cast<size_t>(b * T + t);
      row.ids.push_back(ids.data[i]);
      row.timesteps.push_back(time.data[i]);
      row.returns.push_back(returns ? returns->data[i] : 0);
      row.states.insert(row.states.end(), states.data.begin() + static_cast<int64_t>(i) * F,
                        states.data.begin() + static_cast<int64_t>(i + 1) * F);
    }
  }
  // Every row's steps [from, to), read whole: logits (B, to - from, A).
  const auto read = [&](int64_t from, int64_t to, SegmentMemory* memory) {
    const int64_t n = to - from;
    std::vector<int32_t> w_ids, w_states, w_returns, w_time;
    for (const StepWindow::Row& row : s.rows) {
      w_ids.insert(w_ids.end(), row.ids.begin() + from, row.ids.begin() + to);
      w_returns.insert(w_returns.end(), row.returns.begin() + from, row.returns.begin() + to);
      w_time.insert(w_time.end(), row.timesteps.begin() + from, row.timesteps.begin() + to);
      w_states.insert(w_states.end(), row.states.begin() + from * F, row.states.begin() + to * F);
    }
    ModelInputs window = {{kStates, IndexTensor({B, n, F}, w_states)}, {kTimesteps, IndexTensor({B, n}, w_time)}};
    if (return_emb) window[kReturns] = IndexTensor({B, n}, w_returns);
    ModelContext whole;
    whole.inputs = &window;
    whole.memory = memory;
    return forward(IndexTensor({B, n}, w_ids), whole).value();
  };
  const int64_t before = s.length_;
  s.length_ += T;
  if (!memory_use().carried()) {
    const int64_t n = std::min(s.length_, s.window), keep = std::min(T, n);
    return Var(read(s.length_ - n, s.length_, nullptr).slice(1, n - keep, n).contiguous());  // (B, T, A) while T <= window
  }
  // Segments of K steps from the episode's start, as training read them.
  const int64_t K = cfg_.block_size;
  std::vector<Var> parts;
  for (int64_t done = before; done < s.length_;) {
    const int64_t to = std::min(s.committed + K, s.length_);
    SegmentMemory next = s.memory;  // the memory moves on only when the segment is finished
    const Tensor z = read(s.committed, to, &next);
    parts.push_back(Var(z.slice(1, done - s.committed, to - s.committed).contiguous()));
    if (to - s.committed == K) {
      s.memory = std::move(next);
      s.committed = to;
    }
    done = to;
  }
  return parts.size() == 1 ? parts[0] : concat(parts, 1);  // (B, T, A)
}

MemoryUse DecisionTransformer::memory_use() const { return tapeformer::memory_use(stack_config(cfg_)); }

std::unique_ptr<InferenceState> DecisionTransformer::make_state(int64_t batch, int64_t window) const {
  TAPEFORMER_CHECK(batch >= 1, "DecisionTransformer: batch size must be >= 1, got ", batch);
  auto state = std::make_unique<StepWindow>();
  state->owner = this;
  state->rows.resize(static_cast<size_t>(batch));
  state->window = window <= 0 ? cfg_.block_size : std::min(window, cfg_.block_size);
  return state;
}

ModelKind decision_transformer_model_kind() {
  ModelKind kind;
  kind.name = "decision_transformer";
  kind.summary = "Decision Transformer (Chen et al. 2021): per step the previous action, the return to go and the "
                 "state as tokens, a causal Transformer of any attention, positional scheme and block, the next "
                 "action read at the state; model.vocab_size actions, model.block_size steps (with a block kind that carries "
                 "a memory, model.mem_len steps of segment memory)";
  kind.options = {
      {"dt_state_sizes", std::string("16"), "decision_transformer: each state feature's number of values, e.g. 36,37",
       OptionValue{std::string("4,3")}},
      {"dt_return_scale", 1.0, "decision_transformer: returns to go are embedded divided by this"},
      {"dt_max_timestep", int64_t{64}, "decision_transformer: the timestep table's last row (later steps share it)",
       OptionValue{int64_t{20}}},
      {"dt_returns", true, "decision_transformer: false drops the return tokens (behaviour cloning)"},
      {"dt_dataset", std::string(), "decision_transformer: the checksum of the dataset it trains on (rl train sets it)"}};
  kind.make = [](const ModelConfig& cfg, Rng& rng) -> std::unique_ptr<LanguageModel> {
    return std::make_unique<DecisionTransformer>(cfg, rng);
  };
  kind.footprint = DecisionTransformer::footprint;
  kind.example_inputs = [](const ModelConfig& cfg, int64_t B, int64_t T) {
    const std::vector<int64_t> sizes = DecisionTransformer::state_sizes(cfg);
    const auto F = static_cast<int64_t>(sizes.size());
    std::vector<int32_t> states(static_cast<size_t>(B * T * F)), returns(static_cast<size_t>(B * T)),
        time(static_cast<size_t>(B * T));
    for (int64_t i = 0; i < B * T; ++i) {
      for (int64_t f = 0; f < F; ++f)
        states[static_cast<size_t>(i * F + f)] = static_cast<int32_t>((i * 7 + f * 3 + 1) % sizes[static_cast<size_t>(f)]);
      returns[static_cast<size_t>(i)] = static_cast<int32_t>(5 - i % 7);
      time[static_cast<size_t>(i)] = static_cast<int32_t>(i % T);
    }
    ModelInputs in = {{DecisionTransformer::kStates, IndexTensor({B, T, F}, states)},
                      {DecisionTransformer::kTimesteps, IndexTensor({B, T}, time)}};
    if (cfg.option_bool("dt_returns")) in[DecisionTransformer::kReturns] = IndexTensor({B, T}, returns);
    return in;
  };
  return kind;
}

}  // namespace tapeformer
