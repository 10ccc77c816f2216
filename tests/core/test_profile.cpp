// The step profiler's timers: exclusive family time, forward and backward
// apart, parallel chunks of a timed scope not counted twice, phases as wall
// time, nothing while disabled.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"

using namespace tapeformer;

namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

const profile::Entry* find(const std::vector<profile::Entry>& entries, const std::string& name) {
  for (const profile::Entry& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

// Turns the timers on for a test and off again, with nothing left over.
struct Enabled {
  Enabled() {
    profile::take();
    profile::set_enabled(true);
  }
  ~Enabled() {
    profile::set_enabled(false);
    profile::take();
  }
};

}  // namespace

TEST_CASE("profile: a family's time excludes the families it calls; the backward pass is apart") {
  Enabled on;
  {
    const profile::Scope outer("test outer");
    sleep_ms(20);
    const profile::Scope inner("test inner");
    sleep_ms(200);
  }
  {
    const profile::BackwardPass backward;
    const profile::Scope outer("test outer");
    sleep_ms(30);
  }
  const auto e = profile::take();
  const profile::Entry* outer = find(e, "test outer");
  const profile::Entry* inner = find(e, "test inner");
  REQUIRE(outer != nullptr);
  REQUIRE(inner != nullptr);
  CHECK(outer->calls == 2);
  CHECK(outer->forward_s >= 0.020);
  CHECK(outer->forward_s < 0.150);  // 0.220 and more if the inner scope were not subtracted
  CHECK(outer->backward_s >= 0.030);
  CHECK(inner->forward_s >= 0.200);
  CHECK(inner->backward_s == 0.0);
  CHECK(profile::take().empty());  // take() starts the sums again
}

TEST_CASE("profile: the chunks of a timed scope's parallel loop do not time themselves; phases are wall time") {
  Enabled on;
  parallel::set_num_threads(2);
  {
    const profile::Scope phase("test phase", profile::Kind::Phase);
    const profile::Scope family("test family");
    parallel::parallel_for(4, 1, [](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const profile::Scope chunk("test chunk");
        sleep_ms(5);
      }
    });
  }
  // Outside any family scope (data-parallel shards), each chunk times itself.
  parallel::parallel_for(2, 1, [](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const profile::Scope shard("test shard");
      sleep_ms(5);
    }
  });
  parallel::set_num_threads(0);
  const auto e = profile::take();
  CHECK(find(e, "test chunk") == nullptr);
  REQUIRE(find(e, "test family") != nullptr);
  REQUIRE(find(e, "test phase") != nullptr);
  REQUIRE(find(e, "test shard") != nullptr);
  CHECK(find(e, "test shard")->calls == 2);
  CHECK(find(e, "test phase")->kind == profile::Kind::Phase);
  // The phase does not subtract the family inside it.
  CHECK(find(e, "test phase")->forward_s >= find(e, "test family")->forward_s);
}

TEST_CASE("profile: nothing is recorded while disabled") {
  profile::take();
  {
    const profile::Scope s("test disabled");
    sleep_ms(1);
  }
  CHECK(find(profile::take(), "test disabled") == nullptr);
}
