#include "tapeformer/layers/transformer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "tapeformer/core/error.h"

namespace tapeformer {

TransformerLM::TransformerLM(const ModelConfig& cfg, Rng& rng) : cfg_(cfg) {
  cfg.validate();
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd, rng));
  pos_emb = register_module("pos_emb", positional_kinds().get(cfg.positional).make(cfg, rng));
  drop = register_module("drop", std::make_shared<Dropout>(cfg.dropout));
  stack = register_inline(block_kinds().get(cfg.block).make(cfg, *pos_emb, rng));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias, cfg.norm_eps));
  if (!cfg.tie_weights)
    lm_head = register_module("lm_head", std::make_shared<Linear>(cfg.n_embd, cfg.vocab_size, false, rng));
}

ModelFootprint TransformerLM::footprint(const ModelConfig& cfg) {
  cfg.validate_kinds();
  const BlockKind& blocks = block_kinds().get(cfg.block);
  const double C = static_cast<double>(cfg.n_embd), V = static_cast<double>(cfg.vocab_size), b = cfg.bias ? 1 : 0;
  ModelFootprint f;
  f.parameters = V * C + positional_kinds().get(cfg.positional).parameters(cfg) + blocks.parameters(cfg) +
                 (C + b * C) /* ln_f */ + (cfg.tie_weights ? 0 : C * V);
  return f;
}

Var TransformerLM::embed(const IndexTensor& ids, int64_t start) const {
  return pos_emb->embed(tok_emb->forward(ids), start);  // (B, T, C)
}

Var TransformerLM::logits_from_features(const Var& h) const {
  if (lm_head) return lm_head->forward(h);              // (B, T, V)
  return matmul(h, transpose(tok_emb->weight, 0, 1));  // tied: h E^T, (B, T, V)
}

Var TransformerLM::embed_sequence(const IndexTensor& ids, Rng& rng) const {
  TAPEFORMER_CHECK(ids.shape.rank() == 2, "TransformerLM: ids must be (B, T), got ", ids.shape);
  const int64_t T = ids.shape[1], limit = max_positions();
  TAPEFORMER_CHECK(T >= 1, "TransformerLM: empty sequence (ids ", ids.shape, ")");
  TAPEFORMER_CHECK(limit < 0 || T <= limit, "TransformerLM: sequence length ", T, " exceeds the ", limit,
                   " positions of model.positional \"", cfg_.positional,
                   "\" (model.block_size); a positional scheme without a table takes any length");
  return drop->forward(embed(ids, 0), rng);  // (B, T, C)
}

Var TransformerLM::forward(const IndexTensor& ids, const ModelContext& ctx) const {
  TAPEFORMER_CHECK(ctx.inputs == nullptr || ctx.inputs->empty(), "model.arch \"", cfg_.arch,
                   "\" reads no extra inputs, got \"", ctx.inputs ? ctx.inputs->begin()->first : "", "\"");
  TAPEFORMER_CHECK(ctx.state == nullptr || ctx.memory == nullptr,
                   "TransformerLM: a call reads an inference state or a segment memory, not both");
  Var h;
  if (ctx.state != nullptr) {
    h = features(ids, *ctx.state);
  } else {
    TAPEFORMER_CHECK(ctx.rng != nullptr || !is_training() || cfg_.dropout == 0.0f,
                     "TransformerLM: training with model.dropout = ", cfg_.dropout, " needs an Rng (ModelContext::rng)");
    Rng none(0);  // eval mode or no dropout: nothing is drawn
    h = features(ids, ctx.memory, ctx.rng != nullptr ? *ctx.rng : none);
  }
  return ctx.features ? h : logits_from_features(h);
}

Var TransformerLM::features(const IndexTensor& ids, SegmentMemory* memory, Rng& rng) const {
  if (memory == nullptr) return ln_f->forward(stack->forward(embed_sequence(ids, rng), rng));  // (B, T, C)
  TAPEFORMER_CHECK(memory_use().carried(), "TransformerLM: a segment memory needs model.mem_len > 0");
  TAPEFORMER_CHECK(memory->batch() == 0 || ids.shape.rank() != 2 || memory->batch() == ids.shape[0],
                   "TransformerLM: a memory of ", memory->batch(), " sequences for a batch of ",
                   ids.shape[0]);
  return ln_f->forward(stack->forward(embed_sequence(ids, rng), *memory, rng));  // (B, T, C)
}

MemoryUse TransformerLM::memory_use() const {
  return tapeformer::memory_use(cfg_);
}

namespace {
// The model's state: its stack's, and the positions seen.
class LMState : public InferenceState {
 public:
  std::string name() const override { return "TransformerLM state"; }
  int64_t length() const override { return length_; }
  void reset() override {
    stack->reset();
    length_ = 0;
  }
  const TransformerLM* owner = nullptr;  // the model that made it
  std::unique_ptr<InferenceState> stack;
  int64_t batch = 0, length_ = 0;
};
}  // namespace

namespace {
// The state of a model with memories: the memories after the finished
// segments, the ids of the unfinished one, and the ext_len ids before it that
// are read again with it (B, again).
class SegmentState : public InferenceState {
 public:
  std::string name() const override { return "TransformerLM segment state"; }
  int64_t length() const override { return length_; }
  bool segments() const override { return true; }
  void reset() override {
    memory.reset();
    pending.clear();
    again.clear();
    length_ = 0;
  }
  const TransformerLM* owner = nullptr;  // the model that made it
  SegmentMemory memory;                  // the memories after the finished segments
  std::vector<std::vector<int32_t>> pending;  // per sequence, the unfinished segment's ids
  std::vector<std::vector<int32_t>> again;    // per sequence, the last ext_len ids before it
  int64_t batch = 0, length_ = 0;
};
}  // namespace

Var TransformerLM::forward_segments(const IndexTensor& ids, InferenceState& state) const {
  SegmentState& s = static_cast<SegmentState&>(state);
  const int64_t B = s.batch, T = ids.shape[1], S = cfg_.block_size, ext_len = memory_use().ext_len;
  if (s.pending.empty()) {
    s.pending.resize(static_cast<size_t>(B));
    s.again.resize(static_cast<size_t>(B));
  }
  Rng unused(0);  // eval mode: no dropout draws
  std::vector<Var> parts;
  for (int64_t done = 0; done < T;) {
    const auto p = static_cast<int64_t>(s.pending[0].size()), m = std::min(S - p, T - done);
    const auto e = static_cast<int64_t>(s.again[0].size());
    // (B, e + p + m): the ids read again, the unfinished segment and the next m ids, as evaluation reads them.
    std::vector<int32_t> segment;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int32_t>& row = s.pending[static_cast<size_t>(b)];
      row.insert(row.end(), ids.data.begin() + b * T + done, ids.data.begin() + b * T + done + m);
      const std::vector<int32_t>& before = s.again[static_cast<size_t>(b)];
      segment.insert(segment.end(), before.begin(), before.end());
      segment.insert(segment.end(), row.begin(), row.end());
    }
    SegmentMemory next = s.memory;  // the memories move on only when the segment is finished
    const Var h = features(IndexTensor({B, e + p + m}, std::move(segment)), &next, unused);  // (B, e + p + m, C)
    parts.push_back(Var(h.value().slice(1, e + p, e + p + m).contiguous()));  // inference: no gradient to keep
    if (p + m == S) {
      s.memory = std::move(next);
      for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t>& row = s.pending[static_cast<size_t>(b)];
        std::vector<int32_t>& before = s.again[static_cast<size_t>(b)];
        before.insert(before.end(), row.begin(), row.end());
        before.erase(before.begin(), before.end() - std::min<int64_t>(ext_len, static_cast<int64_t>(before.size())));
        row.clear();
      }
    }
    done += m;
  }
  s.length_ += T;
  return parts.size() == 1 ? parts[0] : concat(parts, 1);  // (B, T, C)
}

std::unique_ptr<InferenceState> TransformerLM::make_state(int64_t batch, int64_t window) const {
  TAPEFORMER_CHECK(batch >= 1, "TransformerLM: batch size must be >= 1, got ", batch);
  TAPEFORMER_CHECK(window >= -1, "TransformerLM: window must be >= 1, 0 (block_size) or -1 (all), got ", window);
  if (memory_use().carried()) {  // memories: read as it trained, segment by segment
    auto state = std::make_unique<SegmentState>();
    state->owner = this;
    state->batch = batch;
    return state;
  }
  auto state = std::make_unique<LMState>();
  state->owner = this;
  state->batch = batch;
  state->stack = stack->make_state(batch, window == 0 ? cfg_.block_size : window);
  return state;
}

Var TransformerLM::features(const IndexTensor& ids, InferenceState& state) const {
  if (auto* segments = dynamic_cast<SegmentState*>(&state)) {
    TAPEFORMER_CHECK(segments->owner == this, "TransformerLM: this inference state was made by another model");
    TAPEFORMER_CHECK(!grad_enabled() && !is_training(),
                     "TransformerLM: the inference-state forward is for inference (eval() and NoGradGuard)");
    TAPEFORMER_CHECK(ids.shape.rank() == 2 && ids.shape[0] == segments->batch && ids.shape[1] >= 1,
                     "TransformerLM: ids ", ids.shape, " must be (", segments->batch, ", T) with T >= 1 for this state");
    try {
      return forward_segments(ids, *segments);
    } catch (...) {
      segments->reset();
      throw;
    }
  }
  LMState& s = state_as<LMState>(state, "TransformerLM", "TransformerLM state");
  TAPEFORMER_CHECK(s.owner == this, "TransformerLM: this inference state was made by another model");
  TAPEFORMER_CHECK(ids.shape.rank() == 2 && ids.shape[0] == s.batch && ids.shape[1] >= 1, "TransformerLM: ids ",
                   ids.shape, " must be (", s.batch, ", T) with T >= 1 for this state");
  const int64_t T = ids.shape[1], limit = max_positions();
  TAPEFORMER_CHECK(limit < 0 || s.length_ + T <= limit, "TransformerLM: ", s.length_, " positions seen + ", T,
                   " new exceed the ", limit, " positions of model.positional \"", cfg_.positional,
                   "\" (reset the state and feed the last ", limit, " tokens)");
  try {
    const Var x = embed(ids, s.length_);  // positions continue after the M seen, (B, T, C)
    const Var h = stack->forward(x, *s.stack);
    s.length_ += T;
    return ln_f->forward(h);  // (B, T, C)
  } catch (...) {
    s.reset();  // some caches may have grown: start over rather than misalign
    throw;
  }
}

}  // namespace tapeformer
