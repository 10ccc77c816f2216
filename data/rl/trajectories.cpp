#include "tapeformer/data/rl/trajectories.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/core/files.h"

namespace tapeformer {

namespace {

constexpr char kMagic[9] = "TFRLTRJ1";
constexpr uint32_t kVersion = 1;

template <class T>
void put(std::ostream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_string(std::ostream& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// The payload read with every count checked against the bytes left.
struct Reader {
  std::istream& in;
  uint64_t left;
  const std::string& origin;
  void bytes(void* to, uint64_t n, const char* what) {
    TAPEFORMER_CHECK(n <= left, origin, ": cannot decode ", what, " (", n, " bytes wanted, ", left, " left)");
    in.read(static_cast<char*>(to), static_cast<std::streamsize>(n));
    TAPEFORMER_CHECK(in.gcount() == static_cast<std::streamsize>(n), origin, ": truncated in ", what);
    left -= n;
  }
  template <class T>
  T get(const char* what) {
    T v{};
    bytes(&v, sizeof v, what);
    return v;
  }
  std::string string(const char* what) {
    const auto n = get<uint64_t>(what);
    TAPEFORMER_CHECK(n <= 4096, origin, ": cannot decode ", what, " (a string of ", n, " bytes)");
    std::string s(n, '\0');
    bytes(s.data(), n, what);
    return s;
  }
  // A count of items taking at least `each` bytes.
  uint64_t count(const char* what, uint64_t each) {
    const auto n = get<uint64_t>(what);
    TAPEFORMER_CHECK(n <= left / each, origin, ": cannot decode ", what, " (", n, " for ", left, " bytes)");
    return n;
  }
};

}  // namespace

int64_t Episode::total() const { return std::accumulate(rewards.begin(), rewards.end(), int64_t{0}); }

PolicyMix parse_policy_mix(const std::string& text, double epsilon) {
  TAPEFORMER_CHECK(epsilon >= 0 && epsilon <= 1, "--epsilon must be in [0, 1], got ", epsilon);
  PolicyMix mix;
  mix.epsilon = epsilon;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon);
    TAPEFORMER_CHECK(name == "random" || name == "noisy" || name == "expert", "--policy: unknown policy \"", name,
                     "\" in \"", text, "\" (known: random, noisy, expert)");
    double w = 1;
    if (colon != std::string::npos) {
      w = parse_number<double>(item.substr(colon + 1), "--policy: the weight of \"" + name + "\"");
      TAPEFORMER_CHECK(w > 0, "--policy: the weight of \"", name, "\" must be a number > 0, got ", w);
    }
    for (const auto& [seen, unused] : mix.weights)
      TAPEFORMER_CHECK(seen != name, "--policy: \"", name, "\" is named twice in \"", text, "\"");
    mix.weights.emplace_back(name, w);
  }
  TAPEFORMER_CHECK(!mix.weights.empty(), "--policy: name at least one policy, e.g. random:0.7,noisy:0.3");
  return mix;
}

Trajectories collect(const std::string& env_name, const EnvironmentOptions& given, const PolicyMix& mix,
                     int64_t episodes, uint64_t seed) {
  TAPEFORMER_CHECK(episodes >= 1 && episodes <= (int64_t{1} << 24), "--episodes must be in [1, 2^24], got ", episodes);
  TAPEFORMER_CHECK(!mix.weights.empty(), "collect: an empty policy mix");
  const EnvironmentKind& kind = environment_kinds().get(env_name);
  Trajectories data;
  data.env = kind.name;
  data.options = environment_options(kind, given);
  std::unique_ptr<Environment> env = kind.make(data.options);
  data.feature_sizes = env->feature_sizes();
  data.actions = env->actions();
  data.max_steps = env->max_steps();
  const std::pair<int32_t, int32_t> rewards = env->reward_range();
  return_bounds(*env);
  double total_weight = 0;
  for (const auto& [name, w] : mix.weights) total_weight += w;
  for (int64_t i = 0; i < episodes; ++i) {
    Episode e;
    e.seed = seed * 1000003ULL + static_cast<uint64_t>(i);
    Rng rng(e.seed ^ 0x9e3779b97f4a7c15ULL);  // the policy's draws, apart from the layout's
    double pick = rng.uniform() * total_weight;
    e.policy = mix.weights.back().first;
    for (const auto& [name, w] : mix.weights) {
      if (pick < w) {
        e.policy = name;
        break;
      }
      pick -= w;
    }
    Observation o = env->reset(e.seed);
    for (bool done = false; !done;) {
      int32_t a = env->expert_action();
      if (e.policy == "random" || (e.policy == "noisy" && rng.uniform() < mix.epsilon)) a = env->random_action(rng);
      const StepResult r = env->step(a);
      // An environment that breaks its own contract would write a dataset no run can read.
      TAPEFORMER_CHECK(r.reward >= rewards.first && r.reward <= rewards.second, "environment \"", kind.name,
                       "\" gave reward ", r.reward, ", outside its reward_range [", rewards.first, ", ",
                       rewards.second, "]");
      TAPEFORMER_CHECK(static_cast<int64_t>(e.actions.size()) < data.max_steps, "environment \"", kind.name,
                       "\" ran past its step cap of ", data.max_steps, " actions");
      e.observations.push_back(std::move(o));
      e.actions.push_back(a);
      e.rewards.push_back(r.reward);
      o = r.observation;
      done = r.done;
    }
    data.episodes.push_back(std::move(e));
  }
  return data;
}

uint64_t save_trajectories(const std::string& path, const Trajectories& d) {
  return write_checked_file(path, kMagic, kVersion, [&](std::ostream& out) {
    put_string(out, d.env);
    put<uint64_t>(out, d.options.size());
    for (const auto& [name, value] : d.options) {
      put_string(out, name);
      put<int64_t>(out, value);
    }
    put<uint64_t>(out, d.feature_sizes.size());
    for (int32_t s : d.feature_sizes) put<int32_t>(out, s);
    put<int32_t>(out, d.actions);
    put<int64_t>(out, d.max_steps);
    put<uint64_t>(out, d.episodes.size());
    for (const Episode& e : d.episodes) {
      put<uint64_t>(out, e.actions.size());
      put_string(out, e.policy);
      put<uint64_t>(out, e.seed);
      for (const Observation& o : e.observations)
        out.write(reinterpret_cast<const char*>(o.data()), static_cast<std::streamsize>(o.size() * sizeof(int32_t)));
      out.write(reinterpret_cast<const char*>(e.actions.data()),
                static_cast<std::streamsize>(e.actions.size() * sizeof(int32_t)));
      out.write(reinterpret_cast<const char*>(e.rewards.data()),
                static_cast<std::streamsize>(e.rewards.size() * sizeof(int32_t)));
    }
    TAPEFORMER_CHECK(out.good(), "cannot write the dataset '", path, "'");
  });
}

Trajectories load_trajectories(const std::string& path) {
  const std::string origin = "dataset '" + path + "'";
  CheckedFile f = open_checked_file(path, kMagic, kVersion, "dataset");
  Reader in{*f.in, f.length, origin};
  Trajectories d;
  d.checksum = f.checksum;
  d.env = in.string("the environment");
  const EnvironmentKind* kind = environment_kinds().find(d.env);
  TAPEFORMER_CHECK(kind != nullptr, origin, ": environment \"", d.env, "\" is not one of ", environment_kinds().names());
  for (uint64_t i = 0, n = in.count("the options", 16); i < n; ++i) {
    const std::string name = in.string("an option");
    d.options[name] = in.get<int64_t>("an option");
  }
  std::unique_ptr<Environment> env;
  try {
    env = kind->make(environment_options(*kind, d.options));
  } catch (const Error& e) {
    fail(origin, ": ", e.what());
  }
  d.feature_sizes.resize(in.count("the features", 4));
  for (int32_t& s : d.feature_sizes) s = in.get<int32_t>("the features");
  d.actions = in.get<int32_t>("the actions");
  d.max_steps = in.get<int64_t>("the step cap");
  TAPEFORMER_CHECK(d.feature_sizes == env->feature_sizes() && d.actions == env->actions() &&
                       d.max_steps == env->max_steps(),
                   origin, ": its observation features, actions or step cap are not those of environment \"", d.env,
                   "\" with its options");
  const std::pair<int32_t, int32_t> rewards = env->reward_range();
  return_bounds(*env);  // refuses an environment whose returns would not fit an int32
  const auto F = static_cast<uint64_t>(d.feature_sizes.size());
  const uint64_t episodes = in.count("the episodes", 8 + 8 + 8 + 4 * (F + 2));
  for (uint64_t i = 0; i < episodes; ++i) {
    Episode e;
    const auto T = in.get<uint64_t>("an episode's length");
    TAPEFORMER_CHECK(T >= 1 && T <= static_cast<uint64_t>(d.max_steps), origin, ": episode ", i, " has ", T,
                     " steps (the environment's cap is ", d.max_steps, ")");
    e.policy = in.string("an episode's policy");
    e.seed = in.get<uint64_t>("an episode's seed");
    TAPEFORMER_CHECK(T * 4 * (F + 2) <= in.left, origin, ": truncated in episode ", i);
    e.observations.assign(T, Observation(F));
    for (Observation& o : e.observations) {
      in.bytes(o.data(), F * 4, "an observation");
      for (uint64_t k = 0; k < F; ++k)
        TAPEFORMER_CHECK(o[k] >= 0 && o[k] < d.feature_sizes[k], origin, ": episode ", i, " has feature ", k, " = ",
                         o[k], ", outside 0..", d.feature_sizes[k] - 1);
    }
    e.actions.resize(T);
    in.bytes(e.actions.data(), T * 4, "the actions");
    for (int32_t a : e.actions)
      TAPEFORMER_CHECK(a >= 0 && a < d.actions, origin, ": episode ", i, " has action ", a, ", outside 0..",
                       d.actions - 1);
    e.rewards.resize(T);
    in.bytes(e.rewards.data(), T * 4, "the rewards");
    // Rewards within the environment's range keep every return to go within
    // return_bounds, which fit the int32 the model reads them as.
    for (uint64_t t = 0; t < T; ++t)
      TAPEFORMER_CHECK(e.rewards[t] >= rewards.first && e.rewards[t] <= rewards.second, origin, ": episode ", i,
                       " has reward ", e.rewards[t], " at step ", t, ", outside environment \"", d.env, "\"'s range [",
                       rewards.first, ", ", rewards.second, "] (a forged or damaged dataset)");
    d.episodes.push_back(std::move(e));
  }
  TAPEFORMER_CHECK(in.left == 0, origin, ": ", in.left, " bytes after the last episode");
  TAPEFORMER_CHECK(!d.episodes.empty(), origin, ": holds no episodes");
  return d;
}

}  // namespace tapeformer
