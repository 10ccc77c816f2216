#include "tapeformer/train/check.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/layers/memory/memory.h"
#include "tapeformer/layers/mlp.h"
#include "tapeformer/layers/positional/positional.h"
#include "tapeformer/train/model_hooks.h"
#include "tapeformer/train/trainer.h"

namespace tapeformer {
namespace fs = std::filesystem;

bool KindCheck::ok() const {
  for (const CheckOutcome& o : outcomes)
    if (o.result == CheckOutcome::Result::failed) return false;
  return true;
}

std::string KindCheck::text() const {
  std::ostringstream out;
  for (const CheckOutcome& o : outcomes) {
    out << family << " \"" << kind << "\": " << o.check << " ";
    switch (o.result) {
      case CheckOutcome::Result::ok: out << "ok" << (o.detail.empty() ? "" : " (" + o.detail + ")"); break;
      case CheckOutcome::Result::failed: out << "FAILED: " << o.detail; break;
      case CheckOutcome::Result::skipped: out << "skipped (" << o.detail << ")"; break;
    }
    out << "\n";
  }
  return out.str();
}

std::vector<std::string> checked_families() {
  return {"model.attention", "model.positional", "model.block", "model.mlp", "memory", "model.arch"};
}

namespace {

constexpr int64_t kVocab = 11, kTokens = 12;

void set_small(ModelConfig& c, const std::vector<ModelOption>& options) {
  for (const ModelOption& o : options)
    if (o.small) c.options[o.name] = *o.small;
}

void turn_on(ModelConfig& c, const MemoryKind& kind) {
  for (const std::string& need : kind.needs) turn_on(c, memory_kinds().get(need));
  set_small(c, kind.options);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// What is checked: the tiny model's config, which parameters are the kind's
// own (the gradient check's), what its outputs may read, and why checks do
// not apply.
struct Subject {
  ModelConfig cfg;
  std::function<bool(const std::string&)> own;
  bool causal = true;        // a language model (strictly causal)
  std::string not_causal;    // why the causality check does not apply, or ""
  std::string not_smooth;    // why finite differences do not apply, or ""
  std::string needs_hooks;   // why a model kind cannot train on its own (its hooks need data), or ""
  // Its extra inputs for ids (B, T) (ModelKind::example_inputs), or null.
  std::function<ModelInputs(const ModelConfig&, int64_t B, int64_t T)> inputs;
};

ModelConfig base() {
  ModelConfig c;
  c.vocab_size = kVocab;
  c.block_size = kTokens;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

// The first positional scheme (from the default on) a config accepts with its other kinds.
void accepted_positional(ModelConfig& c) {
  std::vector<std::string> schemes{c.positional};
  for (const PositionalKind& p : positional_kinds().kinds()) schemes.push_back(p.name);
  std::string first_error;
  for (const std::string& name : schemes) {
    ModelConfig trial = c;
    trial.positional = name;
    set_small(trial, positional_kinds().get(name).options);
    try {
      trial.validate_kinds();
      c = trial;
      return;
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  fail(first_error);
}

Subject subject_of(const std::string& family, const std::string& name) {
  Subject s;
  s.cfg = base();
  ModelConfig& c = s.cfg;
  if (family == "model.attention") {
    const AttentionKind& k = attention_kinds().get(name);
    c.attention = name;
    set_small(c, k.options);
    if (!serves(k.causality, true)) {
      c.causal = false;
      s.causal = false;
    }
    if (k.causality != Causality::strict && k.causality != Causality::either)
      s.not_causal = std::string("its outputs are ") + causality_name(k.causality);
    if (k.causality == Causality::chunk_dependent)
      s.not_smooth = "which keys a query meets moves with the weights in steps (its buckets): a finite difference "
                     "can cross one";
    accepted_positional(c);
    s.own = [](const std::string& p) { return starts_with(p, "0.attn.") && !starts_with(p, "0.attn.pos."); };
  } else if (family == "model.positional") {
    c.positional = name;
    set_small(c, positional_kinds().get(name).options);
    s.own = [](const std::string& p) {
      return starts_with(p, "pos_emb.") || p.find(".pos.") != std::string::npos;
    };
  } else if (family == "model.block") {
    c.block = name;
    set_small(c, block_kinds().get(name).options);
    s.own = [](const std::string& p) { return starts_with(p, "0."); };
  } else if (family == "model.mlp") {
    c.mlp = name;
    set_small(c, mlp_kinds().get(name).options);
    s.own = [](const std::string& p) { return starts_with(p, "0.mlp."); };
  } else if (family == "memory") {
    const MemoryKind& k = memory_kinds().get(name);
    c.positional = "txl";
    turn_on(c, k);
    // Its own parameters where it has any (a learned compression), else the attention that reads it.
    s.own = [](const std::string&) { return true; };
  } else if (family == "model.arch") {
    c.arch = name;
    const ModelKind& k = model_kinds().get(name);
    set_small(c, k.options);
    if (k.small_config) k.small_config(c);
    if (model_hooks_kinds().find(name) != nullptr)
      s.needs_hooks = "its hooks (model_hooks_kinds) train it on what they make of the data";
    s.inputs = k.example_inputs;
    s.own = [](const std::string&) { return true; };
  } else {
    fail("check: unknown family \"", family, "\" (checked: model.attention, model.positional, model.block, "
         "model.mlp, memory, model.arch)");
  }
  return s;
}

IndexTensor random_ids(int64_t B, int64_t T, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(B * T));
  for (auto& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(kVocab)));
  return IndexTensor({B, T}, v);
}

// The subject's extra inputs for ids (B, T), none when it reads none.
ModelInputs inputs_for(const Subject& s, int64_t B, int64_t T) {
  return s.inputs ? s.inputs(s.cfg, B, T) : ModelInputs();
}

// Positions t0..t1-1 of ids or an input, (B, T, ...) -> (B, t1 - t0, ...).
IndexTensor columns_of(const IndexTensor& x, int64_t t0, int64_t t1) {
  const int64_t B = x.shape[0], T = x.shape[1], inner = x.numel() / (B * T);
  Shape dims = x.shape;
  dims[1] = t1 - t0;
  std::vector<int32_t> v;
  for (int64_t b = 0; b < B; ++b)
    v.insert(v.end(), x.data.begin() + (b * T + t0) * inner, x.data.begin() + (b * T + t1) * inner);
  return IndexTensor(dims, v);
}

// Positions t0..t1-1 of each (B, T, ...) input.
ModelInputs columns_of(const ModelInputs& inputs, int64_t t0, int64_t t1) {
  ModelInputs out;
  for (const auto& [name, x] : inputs) out[name] = columns_of(x, t0, t1);
  return out;
}

// The model on whole sequences: with a segment memory, one segment from a fresh memory.
Var whole(const Subject& s, const LanguageModel& model, const IndexTensor& ids, Rng& rng) {
  const ModelInputs inputs = inputs_for(s, ids.shape[0], ids.shape[1]);
  ModelContext ctx;
  ctx.rng = &rng;
  ctx.inputs = &inputs;
  SegmentMemory memory;
  if (model.memory_use().carried()) ctx.memory = &memory;
  return model.forward(ids, ctx);
}

std::unique_ptr<LanguageModel> built(const ModelConfig& c, uint64_t seed, bool large_weights) {
  Rng rng(seed);
  std::unique_ptr<LanguageModel> model = make_model(c, rng);
  // Weights large enough that every position matters (the initial ones are
  // small enough to hide a leak in rounding).
  if (large_weights)
    for (auto& [name, p] : model->named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.3f);
  model->eval();
  return model;
}

// |a - b| <= tol max(1, |b|) everywhere, or where it is not.
std::string far_apart(const Tensor& a, const Tensor& b, double tol) {
  const std::vector<float> x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  if (x.size() != y.size()) return "shapes differ";
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(static_cast<double>(x[i]) - y[i]);
    if (!(d <= tol * std::max(1.0, std::abs(static_cast<double>(y[i]))))) {
      std::ostringstream out;
      out << "element " << i << ": " << x[i] << " against " << y[i];
      return out.str();
    }
  }
  return "";
}

CheckOutcome check_causality(const Subject& s) {
  if (!s.causal || !s.not_causal.empty())
    return {"causality", CheckOutcome::Result::skipped, s.not_causal.empty() ? "a bidirectional model" : s.not_causal};
  const auto model = built(s.cfg, 1, true);
  NoGradGuard no_grad;
  Rng unused(0);
  IndexTensor ids = random_ids(2, kTokens, 2);
  const Tensor before = whole(s, *model, ids, unused).value();  // (B, T, V)
  const int64_t t = kTokens / 2;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t u = t; u < kTokens; ++u) {
      int32_t& id = ids.data[static_cast<size_t>(b * kTokens + u)];
      id = (id + 1 + static_cast<int32_t>(u)) % kVocab;
    }
  const Tensor after = whole(s, *model, ids, unused).value();
  if (after.slice(1, 0, t).to_vector() != before.slice(1, 0, t).to_vector()) {
    for (int64_t u = 0; u < t; ++u)
      if (after.slice(1, u, u + 1).to_vector() != before.slice(1, u, u + 1).to_vector())
        return {"causality", CheckOutcome::Result::failed,
                "the output at position " + std::to_string(u) + " changed when the tokens from position " +
                    std::to_string(t) + " on did: it reads the future"};
  }
  if (after.slice(1, t, t + 1).to_vector() == before.slice(1, t, t + 1).to_vector())
    return {"causality", CheckOutcome::Result::failed,
            "the output at position " + std::to_string(t) + " did not change with its own token (the probe cannot "
            "see a leak)"};
  return {"causality", CheckOutcome::Result::ok, ""};
}

// A model with memories over kSegments segments: the training forward, its
// memories carried from segment to segment with the gradient recorded (each
// segment after the ext_len tokens before it again, as evaluation reads),
// against sampling's reading through the inference state, under no gradient,
// in pieces that cross the segment boundaries.
CheckOutcome check_segments(const Subject& s, const LanguageModel& model) {
  constexpr int64_t kSegments = 3, B = 2, n = kSegments * kTokens;
  const IndexTensor ids = random_ids(B, n, 9);
  const int64_t ext_len = model.memory_use().ext_len;
  const ModelInputs all = inputs_for(s, B, n);  // the extra inputs of every position, cut like the ids
  std::vector<Tensor> trained;  // per segment, (B, kTokens, V)
  {
    SegmentMemory memory;
    for (int64_t k = 0; k < kSegments; ++k) {
      const int64_t start = k * kTokens, again = std::min(ext_len, start);
      const ModelInputs inputs = columns_of(all, start - again, start + kTokens);
      Rng unused(0);
      ModelContext ctx;
      ctx.rng = &unused;
      ctx.memory = &memory;
      ctx.inputs = inputs.empty() ? nullptr : &inputs;
      const Tensor logits = model.forward(columns_of(ids, start - again, start + kTokens), ctx).value();
      trained.push_back(logits.slice(1, again, again + kTokens));  // the re-fed positions dropped
    }
  }
  NoGradGuard no_grad;
  auto state = model.make_state(B);
  for (const auto& [t0, t1] : {std::pair<int64_t, int64_t>{0, 3}, {3, 4}, {4, 9}, {9, 14}, {14, 15}, {15, 23},
                               {23, 24}, {24, 25}, {25, 31}, {31, n}}) {
    const ModelInputs piece = columns_of(all, t0, t1);
    ModelContext ctx;
    ctx.state = state.get();
    ctx.inputs = piece.empty() ? nullptr : &piece;
    const Tensor got = model.forward(columns_of(ids, t0, t1), ctx).value();  // (B, t1 - t0, V)
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t k = t / kTokens, i = t % kTokens;
      const std::string where =
          far_apart(got.slice(1, t - t0, t - t0 + 1), trained[static_cast<size_t>(k)].slice(1, i, i + 1), 1e-4);
      if (!where.empty())
        return {"generation", CheckOutcome::Result::failed,
                "position " + std::to_string(t) + " (segment " + std::to_string(k + 1) + " of " +
                    std::to_string(kSegments) + ", read through the inference state in the piece " +
                    std::to_string(t0) + ".." + std::to_string(t1 - 1) +
                    ") differs from the training forward with the memories carried (" + where +
                    "): sampling does not carry the memory as training does (is it updated when no gradient is "
                    "recorded?)"};
    }
  }
  if (state->length() != n)
    return {"generation", CheckOutcome::Result::failed,
            "the state says it has seen " + std::to_string(state->length()) + " positions, not " + std::to_string(n)};
  return {"generation", CheckOutcome::Result::ok, "over " + std::to_string(kSegments) + " segments, memories carried"};
}

CheckOutcome check_generation(const Subject& s) {
  if (!s.causal || !s.not_causal.empty())
    return {"generation", CheckOutcome::Result::skipped,
            s.not_causal.empty() ? "a bidirectional model has no inference state" : s.not_causal};
  const auto model = built(s.cfg, 3, true);
  if (model->memory_use().carried()) {
    // Relative positions, and a learned table that starts again with each segment.
    CheckOutcome last = check_segments(s, *model);
    if (last.result != CheckOutcome::Result::ok || s.cfg.positional == "learned") return last;
    Subject learned = s;
    learned.cfg.positional = "learned";
    try {
      learned.cfg.validate();
    } catch (const Error&) {
      return last;  // the kind needs relative positions
    }
    last = check_segments(learned, *built(learned.cfg, 3, true));
    if (last.result == CheckOutcome::Result::ok) last.detail += ", with model.positional \"txl\" and \"learned\"";
    return last;
  }
  NoGradGuard no_grad;
  Rng unused(0);
  const IndexTensor ids = random_ids(2, kTokens, 4);
  const Tensor full = whole(s, *model, ids, unused).value();  // (B, T, V)
  auto state = model->make_state(2);
  const ModelInputs inputs = inputs_for(s, 2, kTokens);
  for (const auto& [t0, t1] : {std::pair<int64_t, int64_t>{0, 3}, {3, 4}, {4, 5}, {5, 9}, {9, kTokens}}) {
    const ModelInputs piece = columns_of(inputs, t0, t1);
    ModelContext ctx;
    ctx.state = state.get();
    ctx.inputs = &piece;
    const Tensor got = model->forward(columns_of(ids, t0, t1), ctx).value();
    const std::string where = far_apart(got, full.slice(1, t0, t1), 1e-4);
    if (!where.empty())
      return {"generation", CheckOutcome::Result::failed,
              "positions " + std::to_string(t0) + ".." + std::to_string(t1 - 1) +
                  " read through the inference state differ from the whole-sequence forward (" + where + ")"};
  }
  if (state->length() != kTokens)
    return {"generation", CheckOutcome::Result::failed,
            "the state says it has seen " + std::to_string(state->length()) + " positions, not " +
                std::to_string(kTokens)};
  return {"generation", CheckOutcome::Result::ok, ""};
}

CheckOutcome check_resume(const Subject& s) {
  if (!s.causal) return {"resume", CheckOutcome::Result::skipped, "a bidirectional model is no language model"};
  if (!s.needs_hooks.empty()) return {"resume", CheckOutcome::Result::skipped, s.needs_hooks};
  const fs::path dir = fs::temp_directory_path() / ("tapeformer-check-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Remove {
    fs::path p;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } remove{dir};
  {
    std::ofstream text(dir / "text.txt");
    for (int i = 1; i <= 60; ++i) text << "line " << i << ": the quick brown fox jumps over the lazy dog.\n";
  }
  TrainConfig c;
  c.model = s.cfg;
  c.data.path = (dir / "text.txt").string();
  c.train.batch_size = 4;
  c.train.shards = 2;
  c.schedule.warmup_iters = 2;
  c.schedule.decay_iters = 6;
  c.eval.interval = 3;
  c.eval.iters = 1;
  c.eval.final_iters = 1;
  c.checkpoint.interval = 3;
  c.log.interval = 1;
  const auto run = [&](int64_t steps, const std::string& out, bool resume) {
    std::unique_ptr<Trainer> t;
    if (resume) {
      t = Trainer::resume(out, [&](TrainConfig& saved) { saved.train.max_iters = steps; });
    } else {
      TrainConfig fresh = c;
      fresh.train.max_iters = steps;
      t = std::make_unique<Trainer>(fresh, out);
    }
    t->set_quiet(true);
    return t->run();
  };
  const TrainResult straight = run(6, (dir / "straight").string(), false);
  run(3, (dir / "split").string(), false);
  const TrainResult resumed = run(6, (dir / "split").string(), true);
  if (straight.train_loss != resumed.train_loss || straight.val_loss != resumed.val_loss) {
    std::ostringstream out;
    out.precision(9);
    out << "6 straight steps end at train loss " << straight.train_loss << ", val loss " << straight.val_loss
        << "; 3 steps, a checkpoint and 3 more at " << resumed.train_loss << ", " << resumed.val_loss
        << ": some state is not in the checkpoint";
    return {"resume", CheckOutcome::Result::failed, out.str()};
  }
  return {"resume", CheckOutcome::Result::ok, ""};
}

CheckOutcome check_gradient(const Subject& s) {
  if (!s.not_smooth.empty()) return {"gradient", CheckOutcome::Result::skipped, s.not_smooth};
  const auto model = built(s.cfg, 5, false);  // the initial, well-conditioned weights
  std::vector<Var> vars;
  int64_t elements = 0;
  constexpr int64_t kBudget = 1200;  // elements checked: a few seconds at most
  for (const auto& [name, p] : model->named_parameters()) {
    if (!s.own(name) || (!vars.empty() && elements + p.numel() > kBudget)) continue;
    vars.push_back(p);
    elements += p.numel();
    if (elements >= kBudget) break;
  }
  if (vars.empty()) return {"gradient", CheckOutcome::Result::skipped, "it has no parameters of its own"};
  const IndexTensor ids = random_ids(2, kTokens, 6), targets = random_ids(2, kTokens, 7);
  const ModelInputs inputs = inputs_for(s, 2, kTokens);
  // A memory model reads a segment after one that filled its memories. The
  // memories hold no gradient by design, so they are filled once, before the
  // weights are perturbed, and each evaluation starts from a copy.
  SegmentMemory filled;
  if (model->memory_use().carried()) {
    NoGradGuard no_grad;
    Rng unused(0);
    ModelContext ctx;
    ctx.rng = &unused;
    ctx.memory = &filled;
    ctx.inputs = &inputs;
    model->forward(random_ids(2, kTokens, 8), ctx);
  }
  GradcheckOptions opt;
  opt.extrapolate = true;
  opt.step_floor = 0.05;  // the weights' own scale (they start at about 0.02)
  opt.label = "the model's loss";
  const GradcheckResult r = gradcheck_vars(
      [&] {
        Rng unused(0);
        ModelContext ctx;
        ctx.rng = &unused;
        ctx.inputs = &inputs;
        SegmentMemory memory = filled;
        if (model->memory_use().carried()) ctx.memory = &memory;
        return cross_entropy(model->forward(ids, ctx), targets);
      },
      vars, opt);
  if (!r.ok) return {"gradient", CheckOutcome::Result::failed, r.message};
  return {"gradient", CheckOutcome::Result::ok, ""};
}

}  // namespace

KindCheck check_kind(const std::string& family, const std::string& name) {
  KindCheck r{family, name, {}};
  Subject s;
  try {
    s = subject_of(family, name);
    s.cfg.validate();
  } catch (const Error& e) {
    if (std::string(e.what()).find("unknown kind") != std::string::npos ||
        std::string(e.what()).find("unknown family") != std::string::npos)
      throw;
    r.outcomes.push_back({"config", CheckOutcome::Result::failed, std::string("its small test config is refused: ") + e.what()});
    return r;
  }
  try {
    built(s.cfg, 1, false);
    r.outcomes.push_back({"parameters", CheckOutcome::Result::ok, ""});
  } catch (const Error& e) {
    r.outcomes.push_back({"parameters", CheckOutcome::Result::failed, e.what()});
    return r;  // nothing else can be built
  }
  const auto guarded = [&](const std::function<CheckOutcome()>& check, const char* what) {
    if (!s.needs_hooks.empty() && !s.inputs) {
      r.outcomes.push_back({what, CheckOutcome::Result::skipped, s.needs_hooks + ", and its kind gives no "
                            "example_inputs to run it on without them"});
      return;
    }
    try {
      r.outcomes.push_back(check());
    } catch (const Error& e) {
      r.outcomes.push_back({what, CheckOutcome::Result::failed, e.what()});
    }
  };
  guarded([&] { return check_causality(s); }, "causality");
  guarded([&] { return check_generation(s); }, "generation");
  guarded([&] { return check_resume(s); }, "resume");
  guarded([&] { return check_gradient(s); }, "gradient");
  return r;
}

}  // namespace tapeformer
