// Golden tests: forward values and gradients of the core ops (and the
// attention kernels: causal softmax, strided's grouped heads, FAVOR+, LSH's
// positioned attention) checked against
// PyTorch. The fixtures tests/fixtures/golden_<case>.txt are produced by
// tests/fixtures/make_golden.py (run by hand with Debian's python3-torch); each
// holds the inputs, a fixed upstream gradient R, the reference output `out`
// and, for every float input NAME, the reference gradient `grad_NAME` of
// L = sum(out * R). References are computed in float64 and stored as float32.
//
// Fixture format (line based; '#' lines and blank lines are ignored):
//   tensor NAME d0 d1 ...    float tensor [d0, d1, ...] (no dims: rank 0); the
//   v0 v1 ...                next line holds its numel values, row-major
//   index NAME d0 d1 ...     int32 tensor; the next line holds its numel integers
//   scalar NAME value        one number (eps, ignore_index, a scalar R)
//
// Every case runs three times: with contiguous inputs, with every rank >= 2
// float input (and R) as a transposed view (storage holds the last two dims
// swapped), and with every float input (and R) as a slice of a wider,
// NaN-padded buffer. Values and gradients must match elementwise within
// |a - b| <= 1e-5 * max(1, |b|).
#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "golden.h"
#include "tapeformer/layers/attention/softmax.h"
#include "tapeformer/layers/attention/sparse.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/memory/compressive.h"
#include "attention_calls.h"

using namespace tapeformer;
using namespace attention_calls;

namespace {

namespace {
std::string fixture_path(const std::string& case_name) {
  return std::string(TAPEFORMER_FIXTURE_DIR) + "/golden_" + case_name + ".txt";
}

}  // namespace

// ---- layouts --------------------------------------------------------------------

enum class Layout { Contiguous, Transposed, Sliced };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Transposed: return "transposed views";
    case Layout::Sliced: return "sliced views";
  }
  return "?";
}

// The same logical values as t, stored per `layout`.
Tensor with_layout(const Tensor& t, Layout layout) {
  if (layout == Layout::Transposed && t.rank() >= 2) {
    Tensor v = t.transpose(-1, -2).contiguous().transpose(-1, -2);
    REQUIRE_FALSE(v.is_contiguous());
    return v;
  }
  if (layout == Layout::Sliced && t.rank() >= 1) {
    Shape wide = t.shape();
    wide[-1] += 3;
    // NaN padding: a kernel that reads outside the view poisons its result.
    Tensor v = Tensor::full(wide, std::numeric_limits<Scalar>::quiet_NaN()).slice(-1, 1, 1 + t.dim(-1));
    v.copy_from(t);
    if (t.rank() >= 2 && t.dim(-2) > 1) REQUIRE_FALSE(v.is_contiguous());
    return v;
  }
  return t;
}

// ---- the runner -------------------------------------------------------------------

using Vars = std::map<std::string, Var>;
using Build = std::function<Var(const Golden&, const Vars&)>;

Golden load_or_fail(const std::string& case_name) {
  try {
    return load_golden_file(fixture_path(case_name));
  } catch (const GoldenError& e) {
    FAIL(e.what());
  }
  return {};
}

// Loads golden_<case_name>.txt, builds each float input in `inputs` as a Var
// with requires_grad, runs `build`, seeds backward with R and compares `out`
// and every `grad_<input>` with the fixture, once per layout.
void run_golden(const std::string& case_name, const std::vector<std::string>& inputs,
                const Build& build) {
  const Golden g = load_or_fail(case_name);
  for (Layout layout : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
    const std::string where = g.path + " (" + layout_name(layout) + ")";
    INFO(where);
    try {
      TapeScope scope;  // a fresh tape, so a failed run leaves nothing behind
      Vars vars;
      for (const std::string& name : inputs)
        vars[name] = Var(with_layout(g.tensor(name), layout), /*requires_grad=*/true, name);
      const Var out = build(g, vars);
      check_close(out.value(), g.tensor("out"), where + ": out");
      const Tensor seed = g.has_tensor("R") ? with_layout(g.tensor("R"), layout)
                                            : Tensor::scalar(static_cast<Scalar>(g.scalar("R")));
      backward(out, seed);
      for (const std::string& name : inputs) {
        const Var& v = vars.at(name);
        if (!v.has_grad()) {
          FAIL_CHECK(where << ": input '" << name << "' received no gradient");
          continue;
        }
        check_close(v.grad(), g.tensor("grad_" + name), where + ": grad_" + name);
      }
    } catch (const GoldenError& e) {
      FAIL_CHECK(e.what());
    } catch (const Error& e) {
      FAIL_CHECK(where << ": tapeformer::Error: " << e.what());
    }
  }
}

Var in(const Vars& v, const char* name) { return v.at(name); }

}  // namespace

// ---- matmul -----------------------------------------------------------------------

TEST_CASE("golden: matmul 2-D [3,4] x [4,5]") {
  run_golden("matmul_2d", {"a", "b"},
             [](const Golden&, const Vars& v) { return matmul(in(v, "a"), in(v, "b")); });
}

TEST_CASE("golden: matmul 2-D with rhs a transposed view of a stored [5,4] tensor") {
  const Golden g = load_or_fail("matmul_2d");
  TapeScope scope;
  const Tensor stored = g.tensor("b").transpose(0, 1).contiguous();  // [5, 4] in memory
  REQUIRE(stored.shape() == Shape{5, 4});
  Var a(g.tensor("a"), true, "a");
  Var b(stored.transpose(0, 1), true, "b");  // [4, 5] view, strides {1, 4}
  REQUIRE_FALSE(b.value().is_contiguous());
  REQUIRE(b.value().shares_storage(stored));
  const Var out = matmul(a, b);
  check_close(out.value(), g.tensor("out"), g.path + " (rhs transposed view): out");
  backward(out, g.tensor("R"));
  REQUIRE(a.has_grad());
  REQUIRE(b.has_grad());
  check_close(a.grad(), g.tensor("grad_a"), g.path + " (rhs transposed view): grad_a");
  check_close(b.grad(), g.tensor("grad_b"), g.path + " (rhs transposed view): grad_b");
}

TEST_CASE("golden: matmul batched [2,3,4,5] x [3,5,6]") {
  run_golden("matmul_batched", {"a", "b"},
             [](const Golden&, const Vars& v) { return matmul(in(v, "a"), in(v, "b")); });
}

TEST_CASE("golden: matmul broadcast [2,1,4,5] x [3,5,6]") {
  run_golden("matmul_broadcast", {"a", "b"},
             [](const Golden&, const Vars& v) { return matmul(in(v, "a"), in(v, "b")); });
}

TEST_CASE("golden: matmul [2,3,4] x 2-D [4,5]") {
  run_golden("matmul_3d_2d", {"a", "b"},
             [](const Golden&, const Vars& v) { return matmul(in(v, "a"), in(v, "b")); });
}

TEST_CASE("golden: matmul [19,37] x [37,70]: full and partial GEMM tiles and packets") {
  run_golden("matmul_wide", {"a", "b"},
             [](const Golden&, const Vars& v) { return matmul(in(v, "a"), in(v, "b")); });
}

// ---- neural-network ops --------------------------------------------------------------

TEST_CASE("golden: softmax [3,4,5] and [5,37]") {
  for (const char* name : {"softmax", "softmax_wide"})
    run_golden(name, {"x"}, [](const Golden&, const Vars& v) { return softmax(in(v, "x")); });
}

TEST_CASE("golden: log_softmax [3,4,5] and [5,37]") {
  for (const char* name : {"log_softmax", "log_softmax_wide"})
    run_golden(name, {"x"}, [](const Golden&, const Vars& v) { return log_softmax(in(v, "x")); });
}

TEST_CASE("golden: layer_norm [3,4,5] and [5,37] with weight and bias") {
  for (const char* name : {"layer_norm", "layer_norm_wide"}) {
    run_golden(name, {"x", "weight", "bias"}, [](const Golden& g, const Vars& v) {
      return layer_norm(in(v, "x"), in(v, "weight"), in(v, "bias"), static_cast<Scalar>(g.scalar("eps")));
    });
  }
}

TEST_CASE("golden: rms_norm [3,4,5] and [5,37] with weight") {
  for (const char* name : {"rms_norm", "rms_norm_wide"}) {
    run_golden(name, {"x", "weight"}, [](const Golden& g, const Vars& v) {
      return rms_norm(in(v, "x"), in(v, "weight"), static_cast<Scalar>(g.scalar("eps")));
    });
  }
}

TEST_CASE("golden: cross_entropy [3,4,7] and [5,37] with ignore_index") {
  for (const char* name : {"cross_entropy", "cross_entropy_wide"}) {
    run_golden(name, {"logits"}, [](const Golden& g, const Vars& v) {
      return cross_entropy(in(v, "logits"), g.index("targets"), static_cast<int32_t>(g.scalar("ignore_index")));
    });
  }
}

TEST_CASE("golden: gelu (tanh approximation) [3,4,5] and [5,37]") {
  for (const char* name : {"gelu", "gelu_wide"})
    run_golden(name, {"x"}, [](const Golden&, const Vars& v) { return gelu(in(v, "x")); });
}

TEST_CASE("golden: silu [5,37]") {
  run_golden("silu_wide", {"x"}, [](const Golden&, const Vars& v) { return silu(in(v, "x")); });
}

TEST_CASE("golden: embedding [7,5] with repeated ids [3,4]") {
  run_golden("embedding", {"weight"},
             [](const Golden& g, const Vars& v) { return embedding(in(v, "weight"), g.index("ids")); });
}

// ---- attention: the kernels behind the attention kinds ------------------------------------

TEST_CASE("golden: causal softmax attention [2,3,70,8] (two query tiles)") {
  run_golden("softmax_attention", {"q", "k", "v"},
             [](const Golden&, const Vars& v) { return attend(in(v, "q"), in(v, "k"), in(v, "v")); });
}

TEST_CASE("golden: strided attention, l = 4, [2,4,29,8]: window heads by tiles, residue heads in place") {
  ModelConfig cfg;
  cfg.options["stride"] = int64_t{4};
  const auto strided = sparse_pattern_kinds().get("strided").make(cfg);
  run_golden("strided_attention", {"q", "k", "v"}, [&](const Golden&, const Vars& v) {
    const Var& q = v.at("q");
    const int64_t T = q.dim(2);
    return sparse_attention(*strided, q, in(v, "k"), in(v, "v"), {}, 0, 0, 0, nullptr,
                            [&](int64_t, const SparsePattern& p) { return tile_pattern(p, T, T, 0, 0); });
  });
}

TEST_CASE("golden: FAVOR+ causal linear attention on log-features [2,2,23,6], v [2,2,23,3]") {
  run_golden("favor_attention", {"a", "b", "v"},
             [](const Golden&, const Vars& v) { return favor_attention(in(v, "a"), in(v, "b"), in(v, "v")); });
}

TEST_CASE("golden: positioned attention (LSH's core) [1,2,13,4]: rows out of order, self only when alone, lse") {
  run_golden("positioned_attention", {"q", "k", "v"}, [](const Golden& g, const Vars& v) {
    const IndexTensor pos = g.index("pos");  // (1, H, T)
    const std::vector<Var> r = attend_positioned(in(v, "q"), in(v, "k"), in(v, "v"), nullptr, pos, pos, true);
    const Var lse = reshape(r[1], {pos.shape[0], pos.shape[1], pos.shape[2], 1});
    return add(r[0], mul_scalar(exp(mul_scalar(lse, 0.5f)), 0.1f));  // y + 0.1 e^(lse / 2)
  });
}

TEST_CASE("golden: compressive attention-reconstruction loss, conv c = 3 over [2,6,8], queries [2,5,8]") {
  run_golden("compressive_reconstruction", {"w", "b"}, [](const Golden& g, const Vars& v) {
    const Tensor old = g.tensor("old");  // (B, n, C)
    const int64_t C = old.dim(2), c = in(v, "w").dim(0) / C;
    Rng rng(1);
    MultiHeadAttention attn(C, /*n_head=*/2, /*bias=*/true, 0.0f, 0.02f, rng);
    attn.qkv->weight.value().copy_from(g.tensor("w_qkv"));
    attn.qkv->bias.value().copy_from(g.tensor("b_qkv"));
    LayerNorm ln(C);
    ln.weight.value().copy_from(g.tensor("g_ln"));
    ln.bias.value().copy_from(g.tensor("b_ln"));
    const Var h(g.tensor("h"));
    const Var compressed = linear(reshape(Var(old), {old.dim(0), old.dim(1) / c, c * C}), in(v, "w"), in(v, "b"));
    const auto attend = [&](const Var& rows) {
      return attn.content_attention(ln.forward_fixed(detach(h)), ln.forward_fixed(rows));
    };
    return reconstruction_loss(attend, old, compressed);
  });
}

// ---- the harness itself can fail ---------------------------------------------------------

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string load_error(const std::string& path) {
  try {
    load_golden_file(path);
  } catch (const GoldenError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("golden harness: missing and malformed fixtures fail naming the file") {
  const std::string missing = fixture_path("no_such_case");
  const std::string e0 = load_error(missing);
  CHECK(e0.find(missing) != std::string::npos);
  CHECK(e0.find("missing") != std::string::npos);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"tensor x 2 3\n1 2 3 4 5\n", "needs 6 values, found 5"},
      {"tensor x 2\n1 oops\n", "bad value 'oops'"},
      {"tensor x 2\n", "has no value line"},
      {"tensor x 2 -1\n1\n", "bad dim '-1'"},
      {"index t 2\n1 2.5\n", "bad integer '2.5'"},
      {"scalar eps\n", "expected 'scalar NAME value'"},
      {"blob x 1\n1\n", "unknown entry kind 'blob'"},
      {"scalar e 1\nscalar e 2\n", "duplicate name 'e'"},
  };
  int n = 0;
  for (const auto& [bad_text, expect] : bad) {
    const std::string& text = bad_text;  // CAPTURE's lambda cannot take a binding (C++17)
    const std::string path = write_temp("tapeformer_golden_bad_" + std::to_string(n++) + ".txt",
                                        "# malformed on purpose\n" + text);
    const std::string e = load_error(path);
    CAPTURE(text);
    CHECK(e.find(path) != std::string::npos);
    CHECK(e.find(expect) != std::string::npos);
    std::remove(path.c_str());
  }
}

TEST_CASE("golden harness: a perturbed reference value is reported with its index") {
  // Copy golden_matmul_2d.txt, nudge out[1, 3] by 1e-3 (100x the tolerance)
  // and check that the comparison names exactly that element.
  const std::string original = fixture_path("matmul_2d");
  std::istringstream lines(read_all(original));
  std::ostringstream copy;
  bool in_out = false, perturbed = false;
  for (std::string line; std::getline(lines, line);) {
    if (in_out) {
      std::vector<std::string> toks = split_ws(line);
      REQUIRE(toks.size() == 15);
      const int flat = 1 * 5 + 3;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.9g", std::strtod(toks[flat].c_str(), nullptr) + 1e-3);
      toks[flat] = buf;
      line.clear();
      for (size_t i = 0; i < toks.size(); ++i) line += (i ? " " : "") + toks[i];
      in_out = false;
      perturbed = true;
    } else if (line.rfind("tensor out ", 0) == 0) {
      in_out = true;
    }
    copy << line << "\n";
  }
  REQUIRE(perturbed);
  const std::string path = write_temp("tapeformer_golden_perturbed.txt", copy.str());
  const Golden good = load_golden_file(original);
  const Golden bad = load_golden_file(path);
  std::remove(path.c_str());

  TapeScope scope;
  NoGradGuard no_grad;
  const Var out = matmul(Var(good.tensor("a")), Var(good.tensor("b")));
  CHECK_FALSE(compare(out.value(), good.tensor("out"), "out").has_value());
  const std::optional<std::string> failure = compare(out.value(), bad.tensor("out"), "out");
  REQUIRE(failure.has_value());
  CAPTURE(*failure);
  CHECK(failure->find("1 of 15 elements") != std::string::npos);
  CHECK(failure->find("worst at [1, 3]") != std::string::npos);
}
