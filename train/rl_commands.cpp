#include "tapeformer/train/rl_commands.h"

#include <cmath>
#include <cstdio>
#include <map>

#include "tapeformer/core/error.h"
#include "tapeformer/data/rl/trajectories.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/model_hooks.h"
#include "tapeformer/train/run_directory.h"

namespace tapeformer {

int run_rl_collect(const RlCollectArgs& args) {
  TAPEFORMER_CHECK(!args.out.empty(), "rl collect: name the dataset to write with --out FILE");
  RunDirectory::check_output("rl collect", args.out, {});
  EnvironmentOptions options;
  for (const std::string& o : args.options) {
    const size_t eq = o.find('=');
    TAPEFORMER_CHECK(eq != std::string::npos && eq > 0, "--option must be name=value, got \"", o, "\"");
    const std::string value = o.substr(eq + 1);
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    TAPEFORMER_CHECK(!value.empty() && end == value.c_str() + value.size(), "--option ", o.substr(0, eq),
                     ": the value must be an integer, got \"", value, "\"");
    options[o.substr(0, eq)] = v;
  }
  const Trajectories data = collect(args.env, options, parse_policy_mix(args.policy, args.epsilon), args.episodes, args.seed);
  save_trajectories(args.out, data);
  const Trajectories saved = load_trajectories(args.out);  // what a run will read, and its checksum
  const EnvironmentKind& kind = environment_kinds().get(data.env);
  std::unique_ptr<Environment> env = kind.make(data.options);
  double sum = 0, squares = 0, best = 0;
  int64_t steps = 0, top = INT64_MIN;
  std::map<std::string, std::pair<int64_t, double>> by_policy;  // episodes, return sum
  for (const Episode& e : data.episodes) {
    const auto r = static_cast<double>(e.total());
    sum += r, squares += r * r;
    top = std::max(top, e.total());
    steps += static_cast<int64_t>(e.actions.size());
    env->reset(e.seed);
    best += env->best_return();
    auto& p = by_policy[e.policy];
    ++p.first, p.second += r;
  }
  const auto n = static_cast<double>(data.episodes.size());
  const double mean = sum / n, sd = n > 1 ? std::sqrt(std::max(0.0, (squares - n * mean * mean) / (n - 1))) : 0.0;
  std::string policies;
  for (const auto& [name, p] : by_policy)
    policies += (policies.empty() ? "\"" : ", \"") + name + "\": {\"episodes\": " + std::to_string(p.first) +
                ", \"return_mean\": " + json_number(p.second / static_cast<double>(p.first)) + "}";
  std::printf("{\"env\": \"%s\", \"episodes\": %lld, \"steps\": %lld, \"return_mean\": %s, \"return_sd\": %s, "
              "\"return_max\": %lld, \"best_return_mean\": %s, \"by_policy\": {%s}, \"checksum\": \"%016llx\"}\n",
              data.env.c_str(), static_cast<long long>(data.episodes.size()), static_cast<long long>(steps),
              json_number(mean).c_str(), json_number(sd).c_str(), static_cast<long long>(top),
              json_number(best / n).c_str(), policies.c_str(), static_cast<unsigned long long>(saved.checksum));
  return 0;
}

}  // namespace tapeformer

namespace tapeformer {
namespace {

// A Decision Transformer trains on episodes, never on a text: a run that
// would read text windows is refused. A program's task (its own batch
// source of episode windows) trains it through the stock Trainer.
class DecisionTransformerHooks : public ModelHooks {
 public:
  explicit DecisionTransformerHooks(const HookSite& site) : task_(!site.task.empty()) {}
  BatchSource& train_source(BatchSource& inner) override {
    TAPEFORMER_CHECK(task_, "model.arch \"decision_transformer\" trains on episodes of an environment (a program's "
                            "batch source of episode windows), not on a text");
    return inner;
  }
  void begin_text(const EvalText&, const std::string& path, const std::string&, double) override {
    fail("model.arch \"decision_transformer\" reads episodes, not the text '", path, "'");
  }
  void sample_inputs(const IndexTensor&, bool, ModelInputs&) override {
    fail("model.arch \"decision_transformer\" acts in an environment: it samples no text");
  }

 private:
  bool task_;
};

}  // namespace

ModelHooksKind decision_transformer_model_hooks() {
  return {"decision_transformer", "episodes only: text training, evaluation and sampling are refused",
          [](const HookSite& site) -> std::unique_ptr<ModelHooks> {
            return std::make_unique<DecisionTransformerHooks>(site);
          }};
}

}  // namespace tapeformer
