// Offline RL environments and datasets (data/rl/): every transition the
// grid world and the T-maze can make from a layout, checked against rules
// written here from their observations; the expert's path against a
// breadth-first search of its own; episodes the same for a seed; datasets
// round-trip, and a damaged or forged file is refused naming the problem;
// episode windows and streams (whole episodes in segments, for a memory)
// batch them as a Decision Transformer reads them.
#include <doctest/doctest.h>

#include <array>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>

#include <cereal/archives/binary.hpp>

#include "tapeformer/core/error.h"
#include "tapeformer/data/rl/episode_windows.h"
#include "tapeformer/data/rl/trajectories.h"
#include "temp_dir.h"

using namespace tapeformer;

namespace {

std::unique_ptr<Environment> make_env(const std::string& name, EnvironmentOptions options = {}) {
  const EnvironmentKind& kind = environment_kinds().get(name);
  return kind.make(environment_options(kind, options));
}

// The grid world's rules, from an observation [agent, key or 36, goal, door row]:
// the next observation and reward after `action`.
std::pair<Observation, int32_t> grid_rule(const Observation& o, int32_t action) {
  const int32_t r = o[0] / 6, c = o[0] % 6, door = o[3];
  const bool held = o[1] == 36;
  int32_t nr = r + (action == 0 ? -1 : action == 1 ? 1 : 0), nc = c + (action == 2 ? -1 : action == 3 ? 1 : 0);
  if (nr < 0 || nr > 5 || nc < 0 || nc > 5 || (nc == 3 && !(nr == door && held))) nr = r, nc = c;
  const int32_t cell = nr * 6 + nc;
  const bool now_held = held || cell == o[1];
  return {{cell, now_held ? 36 : o[1], o[2], door}, cell == o[2] ? 10 : -1};
}

// Replays `path` from a reset with `seed`: the environment after it.
std::unique_ptr<Environment> replay(const std::string& name, uint64_t seed, const std::vector<int32_t>& path,
                                    Observation& o, EnvironmentOptions options = {}) {
  std::unique_ptr<Environment> env = make_env(name, options);
  o = env->reset(seed);
  for (int32_t a : path) o = env->step(a).observation;
  return env;
}

}  // namespace

TEST_CASE("keys_doors: every transition reachable from three layouts follows the rules") {
  for (uint64_t seed : {1, 2, 3}) {
    CAPTURE(seed);
    Observation start;
    replay("keys_doors", seed, {}, start);
    CHECK(start[0] % 6 < 3);   // the agent starts in the left room
    CHECK(start[1] % 6 < 3);   // so does the key
    CHECK(start[2] % 6 > 3);   // the goal is in the right room
    CHECK(start[0] != start[1]);
    // Breadth-first over observations; each transition checked by replaying its path.
    std::map<Observation, std::vector<int32_t>> seen = {{start, {}}};
    std::deque<Observation> queue = {start};
    int64_t transitions = 0;
    bool reached_goal = false;
    while (!queue.empty()) {
      const Observation o = queue.front();
      queue.pop_front();
      for (int32_t a = 0; a < 4; ++a) {
        Observation now;
        std::unique_ptr<Environment> env = replay("keys_doors", seed, seen[o], now);
        REQUIRE(now == o);
        const StepResult r = env->step(a);
        const auto [want, reward] = grid_rule(o, a);
        CHECK(r.observation == want);
        CHECK(r.reward == reward);
        CHECK(r.done == (want[0] == o[2]));
        ++transitions;
        reached_goal = reached_goal || r.done;
        if (!r.done && !seen.count(want)) {
          std::vector<int32_t> path = seen[o];
          path.push_back(a);
          seen[want] = path;
          queue.push_back(want);
        }
      }
    }
    CHECK(reached_goal);
    CHECK(transitions >= 4 * 36);  // the left room with and without the key, and the right room
  }
}

TEST_CASE("keys_doors: the expert takes a shortest path; the step cap ends an episode; bad actions refused") {
  for (uint64_t seed : {4, 5, 6, 7}) {
    CAPTURE(seed);
    std::unique_ptr<Environment> env = make_env("keys_doors");
    const Observation o = env->reset(seed);
    // The test's own search over (cell, key held) for the shortest path's length.
    std::map<std::pair<int32_t, bool>, int32_t> dist = {{{o[0], false}, 0}};
    std::deque<std::pair<int32_t, bool>> queue = {{o[0], false}};
    int32_t shortest = -1;
    while (!queue.empty() && shortest < 0) {
      const auto s = queue.front();
      queue.pop_front();
      for (int32_t a = 0; a < 4; ++a) {
        const Observation from = {s.first, s.second ? 36 : o[1], o[2], o[3]};
        const Observation to = grid_rule(from, a).first;
        const std::pair<int32_t, bool> next = {to[0], to[1] == 36};
        if (dist.count(next)) continue;
        dist[next] = dist[s] + 1;
        if (to[0] == o[2]) shortest = dist[next];
        queue.push_back(next);
      }
    }
    REQUIRE(shortest > 0);
    CHECK(env->best_return() == 11 - shortest);
    int32_t total = 0, steps = 0;
    for (bool done = false; !done; ++steps) {
      const StepResult r = env->step(env->expert_action());
      total += r.reward;
      done = r.done;
    }
    CHECK(steps == shortest);
    CHECK(total == 11 - shortest);
    CHECK_THROWS_WITH_AS(env->step(0), doctest::Contains("the episode has ended"), Error);
  }
  std::unique_ptr<Environment> env = make_env("keys_doors");
  env->reset(1);
  CHECK_THROWS_WITH_AS(env->step(4), doctest::Contains("action 4"), Error);
  int64_t steps = 0;
  for (bool done = false; !done; ++steps) done = env->step(0).done;  // walking up into the border
  CHECK(steps == 30);
}

TEST_CASE("tmaze: every transition of a corridor of 3; the cue only at the first step") {
  for (uint64_t seed : {1, 2, 3, 4}) {
    CAPTURE(seed);
    Observation o;
    replay("tmaze", seed, {}, o, {{"corridor", 3}});
    const int32_t cue = o[1];
    REQUIRE((cue == 1 || cue == 2));
    CHECK(o[0] == 0);
    for (int32_t position = 0; position <= 3; ++position)
      for (int32_t a = 0; a < 3; ++a) {
        CAPTURE(position);
        CAPTURE(a);
        Observation now;
        std::unique_ptr<Environment> env = replay("tmaze", seed, std::vector<int32_t>(position, 0), now, {{"corridor", 3}});
        REQUIRE(now[0] == position);
        CHECK(now[1] == (position == 0 ? cue : 0));
        const StepResult r = env->step(a);
        const bool turns = position == 3 && a != 0;
        CHECK(r.observation == Observation{position < 3 && a == 0 ? position + 1 : position, 0});
        CHECK(r.reward == (turns && a == cue ? 1 : 0));
        CHECK(r.done == turns);
      }
  }
  std::unique_ptr<Environment> env = make_env("tmaze", {{"corridor", 3}});
  env->reset(1);
  int64_t steps = 0;
  for (bool done = false; !done; ++steps) done = env->step(1).done;  // turning in the corridor goes nowhere
  CHECK(steps == 3 + 4);
  const EnvironmentKind& kind = environment_kinds().get("tmaze");
  CHECK_THROWS_WITH_AS(environment_options(kind, {{"length", 3}}), doctest::Contains("no option \"length\""), Error);
  CHECK_THROWS_WITH_AS(kind.make(environment_options(kind, {{"corridor", 0}})), doctest::Contains("corridor"), Error);
  CHECK_THROWS_WITH_AS(environment_kinds().get("maze"), doctest::Contains("keys_doors, tmaze"), Error);
}

TEST_CASE("collect: the same arguments give the same episodes; each policy plays as named") {
  const PolicyMix mix = parse_policy_mix("random:0.5,noisy:0.25,expert:0.25");
  const Trajectories a = collect("keys_doors", {}, mix, 200, 3), b = collect("keys_doors", {}, mix, 200, 3);
  REQUIRE(a.episodes.size() == 200);
  std::map<std::string, int64_t> count;
  for (size_t i = 0; i < a.episodes.size(); ++i) {
    const Episode& e = a.episodes[i];
    CHECK(e.observations == b.episodes[i].observations);
    CHECK(e.actions == b.episodes[i].actions);
    ++count[e.policy];
    std::unique_ptr<Environment> env = make_env("keys_doors");
    env->reset(e.seed);
    if (e.policy == "expert") CHECK(e.total() == env->best_return());
    CHECK(e.total() <= env->best_return());
  }
  CHECK(count["random"] > 70);  // about 100 of 200
  CHECK(count["expert"] > 25);  // about 50
  CHECK(count["noisy"] > 25);
  const Trajectories c = collect("keys_doors", {}, mix, 200, 4);
  CHECK(c.episodes[0].seed != a.episodes[0].seed);
  // The T-maze's "random" walks to the junction and turns at random: about half pay.
  const Trajectories maze = collect("tmaze", {{"corridor", 5}}, parse_policy_mix("random"), 400, 1);
  int64_t paid = 0;
  for (const Episode& e : maze.episodes) {
    paid += e.total();
    CHECK(e.actions.size() == 6);
  }
  CHECK(paid > 150);
  CHECK(paid < 250);
  CHECK_THROWS_WITH_AS(parse_policy_mix("random:0.5,greedy:0.5"), doctest::Contains("unknown policy \"greedy\""), Error);
  CHECK_THROWS_WITH_AS(parse_policy_mix("random:-1"), doctest::Contains("must be a number > 0"), Error);
  CHECK_THROWS_WITH_AS(parse_policy_mix("random,random"), doctest::Contains("named twice"), Error);
}

TEST_CASE("datasets: round trip with a checksum; truncated, corrupted and forged files are refused by name") {
  TempDir dir("rl-dataset");
  const std::string path = (dir.path / "maze.traj").string();
  const Trajectories data = collect("tmaze", {{"corridor", 4}}, parse_policy_mix("random:1,expert:1"), 50, 2);
  save_trajectories(path, data);
  const Trajectories back = load_trajectories(path);
  CHECK(back.env == "tmaze");
  CHECK(back.options.at("corridor") == 4);
  CHECK(back.checksum != 0);
  REQUIRE(back.episodes.size() == 50);
  for (size_t i = 0; i < 50; ++i) {
    CHECK(back.episodes[i].observations == data.episodes[i].observations);
    CHECK(back.episodes[i].actions == data.episodes[i].actions);
    CHECK(back.episodes[i].rewards == data.episodes[i].rewards);
    CHECK(back.episodes[i].policy == data.episodes[i].policy);
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto write = [&](const std::string& b) { std::ofstream(path, std::ios::binary | std::ios::trunc) << b; };
  write(bytes.substr(0, bytes.size() - 7));
  CHECK_THROWS_WITH_AS(load_trajectories(path), doctest::Contains("truncated"), Error);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  write(flipped);
  CHECK_THROWS_WITH_AS(load_trajectories(path), doctest::Contains("corrupted"), Error);
  write("TFCKPT01 not a dataset at all.......");
  CHECK_THROWS_WITH_AS(load_trajectories(path), doctest::Contains("not a tapeformer dataset (bad header)"), Error);
  // A well-formed file whose values the environment cannot produce.
  Trajectories forged = data;
  forged.episodes[3].observations[0][0] = 9;  // position 9 in a corridor of 4
  save_trajectories(path, forged);
  CHECK_THROWS_WITH_AS(load_trajectories(path), doctest::Contains("episode 3 has feature 0 = 9"), Error);
  forged = data;
  forged.options["corridor"] = 5;  // feature sizes no longer those of the environment
  save_trajectories(path, forged);
  CHECK_THROWS_WITH_AS(load_trajectories(path), doctest::Contains("are not those of environment \"tmaze\""), Error);
  CHECK_THROWS_WITH_AS(load_trajectories((dir.path / "missing.traj").string()), doctest::Contains("cannot open"), Error);
}

TEST_CASE("episode windows: previous actions, returns to go, timesteps; a short window is padded on the right") {
  Trajectories data = collect("keys_doors", {}, parse_policy_mix("noisy"), 3, 5);
  const Episode& e = data.episodes[1];
  const auto T = static_cast<int64_t>(e.actions.size());
  REQUIRE(T >= 4);
  EpisodeWindows w(data, {0, 1, 2}, /*K=*/6, /*batch=*/4, /*seed=*/1);
  const int64_t start = T - 3;  // 3 steps left: 3 padded
  const Batch b = w.window(1, start);
  REQUIRE(b.inputs.shape == Shape({1, 6}));
  const IndexTensor &states = b.extra.at("states"), &returns = b.extra.at("returns"), &time = b.extra.at("timesteps");
  int64_t to_come = 0;
  for (int64_t t = start; t < T; ++t) to_come += e.rewards[static_cast<size_t>(t)];
  for (int64_t k = 0; k < 6; ++k) {
    CAPTURE(k);
    const int64_t t = start + k;
    if (t < T) {
      CHECK(b.inputs.data[static_cast<size_t>(k)] == e.actions[static_cast<size_t>(t - 1)]);
      CHECK(b.targets.data[static_cast<size_t>(k)] == e.actions[static_cast<size_t>(t)]);
      CHECK(returns.data[static_cast<size_t>(k)] == to_come);
      CHECK(time.data[static_cast<size_t>(k)] == t);
      for (size_t f = 0; f < 4; ++f)
        CHECK(states.data[static_cast<size_t>(k) * 4 + f] == e.observations[static_cast<size_t>(t)][f]);
      to_come -= e.rewards[static_cast<size_t>(t)];
    } else {
      CHECK(b.targets.data[static_cast<size_t>(k)] == kIgnoreTarget);
    }
  }
  CHECK(w.window(1, 0).inputs.data[0] == 4);  // the start token: no action before the first step
  // Batches: the same seed, the same windows; each start a real step of a drawn episode.
  EpisodeWindows again(data, {0, 1, 2}, 6, 4, 1);
  const Batch x = w.next(), y = again.next();
  CHECK(x.inputs.data == y.inputs.data);
  CHECK(x.extra.at("timesteps").data == y.extra.at("timesteps").data);
  CHECK_THROWS_WITH_AS(w.window(1, T), doctest::Contains("step"), Error);
}

namespace {

// The batch source's position as bytes, and a source loading them.
std::string position_of(const BatchSource& s) {
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive ar(out);
    s.save_position(ar);
  }
  return out.str();
}
void load_into(BatchSource& s, const std::string& bytes) {
  std::istringstream in(bytes);
  cereal::BinaryInputArchive ar(in);
  s.load_position(ar);
}

}  // namespace

TEST_CASE("episode streams: whole episodes in segments from their starts; restarted with each group; position") {
  // Four T-maze episodes of 5 steps (corridor 4), one cut to 2 steps: rows read their episode K = 2 steps at a time,
  // a row whose episode has ended reads padding, and the next group starts
  // when the longest is read.
  Trajectories data = collect("tmaze", {{"corridor", 4}}, parse_policy_mix("random"), 4, 3);
  data.episodes[3].observations.resize(2);  // a 2-step episode
  data.episodes[3].actions.resize(2);
  data.episodes[3].rewards.resize(2);
  EpisodeStreams s(data, {0, 1, 2, 3}, /*K=*/2, /*batch=*/2, /*seed=*/4);
  std::vector<Batch> got;
  std::vector<bool> restarted;
  for (int i = 0; i < 7; ++i) {
    got.push_back(s.next());
    restarted.push_back(s.restarted());
  }
  // Each group takes ceil(longest / 2) segments: 3 when a 5-step episode is in it, 1 for two short ones.
  REQUIRE(restarted[0]);
  int64_t segment = 0;
  std::vector<int32_t> first_time;  // the timestep of each row's first step in the segment
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    segment = restarted[i] ? 0 : segment + 1;
    const IndexTensor& time = got[i].extra.at("timesteps");
    for (int64_t b = 0; b < 2; ++b) {
      const bool padding = got[i].targets.data[static_cast<size_t>(b * 2)] == kIgnoreTarget;
      if (!padding) CHECK(time.data[static_cast<size_t>(b * 2)] == 2 * segment);  // from the episode's start
      if (segment == 0) CHECK(got[i].inputs.data[static_cast<size_t>(b * 2)] == data.actions);  // the start token
    }
    if (segment == 2) {  // the 5-step episodes' last step; a 2-step episode's row is all padding
      for (int64_t b = 0; b < 2; ++b) CHECK(got[i].targets.data[static_cast<size_t>(b * 2 + 1)] == kIgnoreTarget);
    }
    CHECK(segment <= 2);
  }
  // A group of a 5-step and the 2-step episode, read as next() reads it: the short row pads from segment 1 on.
  const std::vector<Batch> pair = s.read({0, 3});
  REQUIRE(pair.size() == 3);
  CHECK(pair[0].targets.data[2] == data.episodes[3].actions[0]);
  CHECK(pair[0].targets.data[3] == data.episodes[3].actions[1]);
  for (size_t i = 1; i < 3; ++i)
    for (size_t k = 2; k < 4; ++k) CHECK(pair[i].targets.data[k] == kIgnoreTarget);
  CHECK(pair[2].targets.data[0] == data.episodes[0].actions[4]);
  CHECK(pair[2].extra.at("timesteps").data[0] == 4);
  // The position mid-group: a source built alike that loads it reads the same batches next.
  EpisodeStreams a(data, {0, 1, 2, 3}, 2, 2, 4);
  a.next();
  const std::string mid = position_of(a);
  EpisodeStreams b(data, {0, 1, 2, 3}, 2, 2, 4);
  load_into(b, mid);
  for (int i = 0; i < 4; ++i) {
    const Batch x = a.next(), y = b.next();
    CHECK(x.inputs.data == y.inputs.data);
    CHECK(x.targets.data == y.targets.data);
    CHECK(x.extra.at("timesteps").data == y.extra.at("timesteps").data);
    CHECK(a.restarted() == b.restarted());
  }
  // Positions of another source are refused by name.
  EpisodeStreams wide(data, {0, 1, 2, 3}, 2, 3, 4);
  wide.next();
  EpisodeStreams narrow(data, {0, 1, 2, 3}, 2, 2, 4);
  CHECK_THROWS_WITH_AS(load_into(narrow, position_of(wide)), doctest::Contains("the position's rows"), Error);
  EpisodeStreams only_first(data, {0}, 2, 2, 4);
  only_first.next();
  EpisodeStreams last(data, {3}, 2, 2, 4);
  CHECK_THROWS_WITH_AS(load_into(last, position_of(only_first)), doctest::Contains("not one this source reads"), Error);
  only_first.next();  // segment 2 of episode 0's 3
  Trajectories shorter = data;
  shorter.episodes[0] = data.episodes[3];  // 1 segment
  EpisodeStreams short_first(shorter, {0}, 2, 2, 4);
  CHECK_THROWS_WITH_AS(load_into(short_first, position_of(only_first)), doctest::Contains("past its episodes"), Error);
}

namespace {

// An environment that breaks its own contract: rewards of `reward` each step
// for `steps` steps, and a reward range of [lo, hi].
class Liar : public Environment {
 public:
  Liar(int32_t reward, int32_t lo, int32_t hi, int64_t cap) : reward_(reward), lo_(lo), hi_(hi), cap_(cap) {}
  std::string name() const override { return "liar"; }
  std::vector<int32_t> feature_sizes() const override { return {2}; }
  int32_t actions() const override { return 2; }
  int64_t max_steps() const override { return cap_; }
  Observation reset(uint64_t) override {
    steps_ = 0;
    return {0};
  }
  StepResult step(int32_t) override {
    ++steps_;
    return {{0}, reward_, steps_ >= 3};
  }
  int32_t expert_action() const override { return 0; }
  int32_t best_return() const override { return 0; }
  std::pair<int32_t, int32_t> reward_range() const override { return {lo_, hi_}; }

 private:
  int32_t reward_, lo_, hi_;
  int64_t cap_, steps_ = 0;
};

}  // namespace

TEST_CASE("rewards and returns: within each environment's range; bounds that would wrap an int32 refused") {
  // Every reward of many episodes of each policy lies in the environment's range.
  for (const auto& [name, options] : std::vector<std::pair<std::string, EnvironmentOptions>>{
           {"keys_doors", {}}, {"tmaze", {{"corridor", 3}}}}) {
    const Trajectories d = collect(name, options, parse_policy_mix("random:0.5,noisy:0.3,expert:0.2", 0.3), 200, 11);
    const std::unique_ptr<Environment> env = make_env(name, options);
    const auto [lo, hi] = env->reward_range();
    const auto [least, most] = return_bounds(*env);
    for (const Episode& e : d.episodes) {
      for (int32_t r : e.rewards) CHECK((r >= lo && r <= hi));
      CHECK((e.total() >= least && e.total() <= most));
    }
  }
  CHECK(return_bounds(*make_env("keys_doors")) == std::pair<int64_t, int64_t>{-30, 300});
  CHECK(return_bounds(*make_env("tmaze", {{"corridor", 4}})) == std::pair<int64_t, int64_t>{0, 8});
  // 2^31 - 1 per step for 2 steps spans more than an int32; so does [-2^31, 0] for one.
  CHECK_THROWS_WITH_AS(return_bounds(Liar(0, 0, INT32_MAX, 2)), doctest::Contains("span more returns than the 32-bit"),
                       Error);
  CHECK_THROWS_WITH_AS(return_bounds(Liar(0, INT32_MIN, 0, 1)), doctest::Contains("span more returns than the 32-bit"),
                       Error);
  CHECK(return_bounds(Liar(0, 0, INT32_MAX, 1)) == std::pair<int64_t, int64_t>{0, INT32_MAX});
  CHECK(return_bounds(Liar(0, -3, 5, 7)) == std::pair<int64_t, int64_t>{-21, 35});
  // collect refuses an environment that gives a reward outside its own range.
  EnvironmentKind liar;
  liar.name = "liar_test";
  liar.summary = "rewards 7 outside [0, 1]";
  liar.make = [](const EnvironmentOptions&) -> std::unique_ptr<Environment> {
    return std::make_unique<Liar>(7, 0, 1, 5);
  };
  environment_kinds().add(liar);
  CHECK_THROWS_WITH_AS(collect("liar_test", {}, parse_policy_mix("expert", 0.3), 1, 1),
                       "environment \"liar_test\" gave reward 7, outside its reward_range [0, 1]", Error);
}
