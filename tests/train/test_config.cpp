#include <doctest/doctest.h>

#include "tapeformer/core/error.h"
#include "tapeformer/train/build.h"
#include "tapeformer/train/config.h"

using namespace tapeformer;

namespace {
std::string error_of(const std::string& json, const std::vector<std::string>& overrides = {}) {
  try {
    TrainConfig::parse(json, "test.json", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("config: the shipped recipe parses and round-trips through to_json") {
  const TrainConfig c = TrainConfig::load(std::string(TAPEFORMER_SOURCE_DIR) + "/configs/shakespeare_char_cpu.json");
  CHECK(c.model.n_layer == 4);
  CHECK(c.model.n_embd == 128);
  CHECK(c.train.batch_size == 12);
  CHECK(c.optimizer.betas[1] == 0.99);
  CHECK(c.schedule.min_lr == doctest::Approx(1e-4).scale(0));
  const TrainConfig again = TrainConfig::parse(c.to_json(), "roundtrip");
  CHECK(again.to_json() == c.to_json());
}

TEST_CASE("config: overrides use dotted keys and JSON values") {
  const TrainConfig c = TrainConfig::parse("{}", "t", {"train.max_iters=7", "optimizer.name=sgd",
                                                       "optimizer.betas=[0.8, 0.9]", "model.bias=false"});
  CHECK(c.train.max_iters == 7);
  CHECK(c.optimizer.name == "sgd");
  CHECK(c.optimizer.betas[0] == 0.8);
  CHECK_FALSE(c.model.bias);
}

TEST_CASE("config: unknown keys, wrong types and bad values are rejected with the key named") {
  CHECK(error_of(R"({"model": {"n_layers": 4}})") ==
        "config test.json: unknown key 'model.n_layers' (did you mean 'model.n_layer'?)");
  CHECK(error_of(R"({"banana": 1})") == "config test.json: unknown key 'banana'");
  CHECK(error_of(R"({"model": {"n_layer": "four"}})") == "config: 'model.n_layer' must be an integer, got \"four\"");
  CHECK(error_of(R"({"model": {"n_layer": 2.5}})") == "config: 'model.n_layer' must be an integer, got 2.5");
  CHECK(error_of(R"({"optimizer": {"lr": "fast"}})") == "config: 'optimizer.lr' must be a number, got \"fast\"");
  CHECK(error_of(R"({"model": {"bias": 1}})") == "config: 'model.bias' must be true or false, got 1");
  CHECK(error_of(R"({"optimizer": {"betas": [0.9]}})") ==
        "config: 'optimizer.betas' must be an array of two numbers, got [0.9]");
  CHECK(error_of(R"({"model": {"n_embd": 130}})") ==
        "config: 'model.n_embd' (130) must be a multiple of 'model.n_head' (4)");
  CHECK(error_of(R"({"train": {"batch_size": 0}})") == "config: 'train.batch_size' must be > 0, got 0");
  CHECK(error_of(R"({"data": {"tokenizer": "bpe"}})") ==
        "config: data.tokenizer: unknown kind \"bpe\" (known: char, byte, sentencepiece, byte_bpe)");
  CHECK(error_of(R"({"data": {"tokenizer": "sentencepiece", "vocab_size": -5}})") ==
        "config: data.vocab_size must be in [0, 65536] (token files hold uint16 ids), got -5");
  CHECK(error_of(R"({"data": {"tokenizer": "sentencepiece", "vocab_size": 1000, "sp_type": "wordpiece"}})") ==
        "config: data.sp_type must be \"bpe\" or \"unigram\", got \"wordpiece\"");
  CHECK(error_of(R"({"data": {"vocab_size": 1000}})")
            .find("config: data.vocab_size is 1000 but data.tokenizer \"char\" takes its vocabulary") == 0);
  CHECK(error_of(R"({"model": {"activation": "swish"}})") ==
        "config: model.activation: unknown kind \"swish\" (known: gelu, relu, silu)");
  CHECK(error_of("{\"model\": ") .find("config test.json: invalid JSON") == 0);
  CHECK(error_of("[1, 2]") == "config test.json: top level must be a JSON object");
  // Found by tests/fuzz/fuzz_config: JSON's overflow error escaped as a different exception.
  CHECK(error_of(R"({"model": {"n_layer": 1e400}})") ==
        "config test.json: invalid JSON: number overflow parsing '1e400'");
  // Nesting that copying or printing the value would recurse through (a
  // segfault at 100,000 levels before the limit): refused while parsing.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK(error_of(R"({"model": {"n_layer": )" + deep + "}}") ==
        "config test.json: JSON nested deeper than 64 levels");
  CHECK(error_of("{}", {"model.n_layer=" + deep}) == "--set model.n_layer: JSON nested deeper than 64 levels");
  const std::string ok = std::string(62, '[') + std::string(62, ']');  // 64 levels with the two objects
  CHECK(error_of(R"({"_note": {"x": )" + ok + "}}").empty());
  CHECK(error_of("{}", {"train.max_iters"}) == "--set: expected key=value, got 'train.max_iters'");
  CHECK(error_of("{}", {"train.max_iter=3"}) ==
        "--set: unknown key 'train.max_iter' (did you mean 'train.max_iters'?)");
  CHECK(error_of(R"({"_comment": "ignored", "model": {"_note": 1}})").empty());
  // Found by tests/fuzz/fuzz_config: JSON's own error here named neither the key nor --set.
  CHECK(error_of("{}", {"model.n_head=1\xff\xff"}) ==
        "--set model.n_head: value is not valid UTF-8 (bad byte 0xFF at offset 1)");
  CHECK(error_of("{}", {"optimizer.name=caf\xc3"}) ==
        "--set optimizer.name: value is not valid UTF-8 (bad byte 0xC3 at offset 3)");
}

TEST_CASE("config: range checks name the key, with values as the optimizer will see them") {
  CHECK(error_of(R"({"optimizer": {"betas": [0.9, 0.99999999]}})") ==
        "config: 'optimizer.betas' must be in [0, 1) (as floats), got 0.99999999");
  CHECK(error_of(R"({"optimizer": {"betas": [-0.1, 0.99]}})") ==
        "config: 'optimizer.betas' must be in [0, 1) (as floats), got -0.1");
  CHECK(error_of(R"({"optimizer": {"lr": 1e-50}, "schedule": {"min_lr": 0}})") ==
        "config: 'optimizer.lr' must be > 0 (as a float), got 1e-50");
  CHECK(error_of(R"({"optimizer": {"eps": 1e-60}})") == "config: 'optimizer.eps' must be > 0 (as a float), got 1e-60");
  CHECK(error_of(R"({"schedule": {"min_lr": 0.01}})") == "config: 'schedule.min_lr' (0.01) must be in [0, optimizer.lr = 0.001]");
  CHECK(error_of(R"({"schedule": {"warmup_iters": 300, "decay_iters": 200}})") ==
        "config: 'schedule.decay_iters' (200) must be >= 'schedule.warmup_iters' (300)");
  CHECK(error_of(R"({"data": {"val_fraction": 1.0}})") == "config: 'data.val_fraction' must be in (0, 1), got 1");
  CHECK(error_of(R"({"model": {"dropout": 1.0}})") == "config: 'model.dropout' must be in [0, 1), got 1");
  CHECK(error_of(R"({"train": {"threads": 5000}})") == "config: 'train.threads' must be in [0, 1024], got 5000");
  CHECK(error_of(R"({"train": {"shards": -1}})") == "config: 'train.shards' must be in [0, 1024], got -1");
}

TEST_CASE("config: huge values are refused with the key named, before they overflow or round away") {
  CHECK(error_of(R"({"train": {"max_iters": 18446744073709551615}})") ==
        "config: 'train.max_iters' must be an integer below 2^63, got 18446744073709551615");
  CHECK(error_of(R"({"train": {"max_iters": 20000000}})") ==
        "config: 'train.max_iters' must be at most 16777216 (optimizer step counts are saved as float32), got 20000000");
  CHECK(error_of(R"({"train": {"grad_accum": 1000000000000000000}})") ==
        "config: 'train.grad_accum' must be at most 2147483647, got 1000000000000000000");
  CHECK(error_of(R"({"train": {"grad_accum": 2000000000, "batch_size": 2000}})") ==
        "config: 'train.batch_size' x 'model.block_size' x 'train.grad_accum' = 2.56e+14 tokens per step is more "
        "than 2^40");
  CHECK(error_of(R"({"eval": {"iters": 4294967296}})") ==
        "config: 'eval.iters' must be at most 2147483647, got 4294967296");
  CHECK(error_of(R"({"schedule": {"warmup_iters": 9223372036854775807, "decay_iters": 9223372036854775807}})") ==
        "config: 'schedule.warmup_iters' must be in [0, 2147483647], got 9223372036854775807");
  CHECK(error_of(R"({"optimizer": {"lr": 1e39}})") == "config: 'optimizer.lr' (1e+39) is too large for a float");
  CHECK(error_of(R"({"optimizer": {"grad_clip": 1e-50}})") ==
        "config: 'optimizer.grad_clip' must be 0 (off) or > 0 (as a float), got 1e-50");
  CHECK(error_of(R"({"optimizer": {"grad_clip": 0}})").empty());
}

TEST_CASE("config: a missing file or a directory is named") {
  CHECK_THROWS_WITH_AS(TrainConfig::load("/nonexistent/x.json"), "config: cannot open '/nonexistent/x.json'", Error);
  CHECK_THROWS_WITH_AS(TrainConfig::load("/tmp"), "config: '/tmp' is a directory, not a JSON file", Error);
  // Opening a FIFO with no writer would block forever; a device may never end.
  CHECK_THROWS_WITH_AS(TrainConfig::load("/dev/null"), "config '/dev/null' is a character device, not a regular file",
                       Error);
}

TEST_CASE("config: a key given twice in one object is refused, not last-wins") {
  // A second "model" section would replace the first: the default model trains.
  CHECK(error_of(R"({"model": {"n_layer": 2}, "model": {"n_head": 2}})") ==
        "config test.json: key 'model' appears twice");
  CHECK(error_of(R"({"model": {"n_layer": 2, "n_embd": 64, "n_layer": 3}})") ==
        "config test.json: key 'model.n_layer' appears twice");
  CHECK(error_of(R"({"_note": 1, "_note": 2})") == "config test.json: key '_note' appears twice");
  // The same key in different objects is no repeat.
  CHECK(error_of(R"({"train": {"seed": 1}, "model": {"n_layer": 2}, "eval": {"iters": 2}, "log": {"interval": 2}})")
            .empty());
  // A checkpoint's stored config is read by the same parser.
  CHECK(error_of(R"({"data": {"path": "a", "path": "b"}})") == "config test.json: key 'data.path' appears twice");
}

TEST_CASE("config: values that cannot train are refused with the key and range named") {
  CHECK(error_of(R"({"optimizer": {"name": "sgd", "momentum": 2}})") ==
        "config: 'optimizer.momentum' must be in [0, 1) (as a float), got 2");
  CHECK(error_of(R"({"optimizer": {"name": "sgd", "momentum": 1}})") ==
        "config: 'optimizer.momentum' must be in [0, 1) (as a float), got 1");
  CHECK(error_of(R"({"optimizer": {"momentum": -0.5}})") ==
        "config: 'optimizer.momentum' must be in [0, 1) (as a float), got -0.5");
  CHECK(error_of(R"({"optimizer": {"name": "sgd", "momentum": 0}})").empty());
  CHECK(error_of(R"({"optimizer": {"betas": [1.5, 0.99]}})") ==
        "config: 'optimizer.betas' must be in [0, 1) (as floats), got 1.5");
  CHECK(error_of(R"({"optimizer": {"weight_decay": -0.1}})") ==
        "config: 'optimizer.weight_decay' must be >= 0, got -0.1");
  CHECK(error_of(R"({"optimizer": {"lr": -1}})") == "config: 'optimizer.lr' must be > 0 (as a float), got -1");
  CHECK(error_of(R"({"optimizer": {"eps": 0}})") == "config: 'optimizer.eps' must be > 0 (as a float), got 0");
}

TEST_CASE("config: keys that the selected kinds would ignore are refused, naming why") {
  CHECK(error_of(R"({"model": {"attention": "linear", "feature_redraw": 100}})") ==
        "config: model.feature_redraw = 100 applies to model.feature_map \"favor\" only (random features); this config "
        "selects model.feature_map \"elu1\"");
  CHECK(error_of(R"({"model": {"attention": "linear", "feature_map": "cos", "n_features": 64}})") ==
        "config: model.n_features = 64 applies to model.feature_map \"favor\" only (random features); this config "
        "selects model.feature_map \"cos\"");
  CHECK(error_of(R"({"model": {"attention": "linear", "feature_map": "favor", "n_features": 64, "feature_redraw": 10}})")
            .empty());
  CHECK(error_of(R"({"eval": {"mem_len": 16}})") ==
        "config: 'eval.mem_len' = 16 applies only to a model with a memory; this model has none (model.mem_len = 0): "
        "leave eval.mem_len at 0 or set model.mem_len");
  CHECK(error_of(R"({"eval": {"mem_len": 16}, "model": {"positional": "txl", "mem_len": 8}})").empty());
}

TEST_CASE("config: a string that is not UTF-8 is refused up front, as a checkpoint could not store it") {
  TrainConfig c = TrainConfig::parse("{}", "t");
  c.data.path = "caf\xe9.txt";  // --data sets it after parsing
  CHECK_THROWS_WITH_AS(c.validate(),
                       "config: 'data.path' = \"caf\xe9.txt\" is not valid UTF-8 (bad byte 0xE9 at offset 3); a "
                       "checkpoint stores it as JSON: rename the file",
                       Error);
  // to_json names the key too, for a caller that skipped validate().
  CHECK_THROWS_WITH_AS(c.to_json(), doctest::Contains("config: 'data.path' cannot be stored as JSON: "), Error);
}

TEST_CASE("config: optimizer and schedule names come from their tables, which a program can extend") {
  CHECK(error_of(R"({"optimizer": {"name": "lion"}})") ==
        "config: 'optimizer.name' must be one of adamw, adam, sgd, got \"lion\"");
  CHECK(error_of(R"({"schedule": {"name": "warm"}})") ==
        "config: 'schedule.name' must be one of constant, linear, cosine, step, got \"warm\"");
  // A schedule registered at start-up is accepted by name and built by make_schedule.
  if (schedule_kinds().find("half") == nullptr)
    schedule_kinds().add({"half", "half of optimizer.lr throughout", [](const TrainConfig& c) -> std::unique_ptr<Schedule> {
                            return std::make_unique<ConstantSchedule>(static_cast<float>(c.optimizer.lr / 2));
                          }});
  const TrainConfig c = TrainConfig::parse(R"({"schedule": {"name": "half"}, "optimizer": {"lr": 0.01}})", "t");
  CHECK(make_schedule(c)->lr_at(7) == doctest::Approx(0.005));
  CHECK_THROWS_WITH_AS(schedule_kinds().add(schedule_kinds().get("cosine")),
                       "schedule.name: a kind named \"cosine\" is already registered", Error);
}
