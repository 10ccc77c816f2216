// Golden fixtures: loader and elementwise comparison shared by the tests
// that check tapeformer against PyTorch-generated reference files
// (tests/fixtures/make_*.py). Format, line based ('#' and blank lines ignored):
//   tensor NAME d0 d1 ...    float tensor; the next line holds its values, row-major
//   index NAME d0 d1 ...     int32 tensor; the next line holds its integers
//   scalar NAME value        one number
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/core/tensor.h"

namespace {

using namespace tapeformer;

constexpr double kRelTol = 1e-5;  // |a - b| <= kRelTol * max(1, |b|)

// ---- loader -----------------------------------------------------------------

class GoldenError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Golden {
  std::string path;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, IndexTensor> indices;
  std::map<std::string, double> scalars;

  bool has_tensor(const std::string& name) const { return tensors.count(name) != 0; }
  const Tensor& tensor(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end())
      throw GoldenError("golden fixture '" + path + "': no tensor named '" + name + "'");
    return it->second;
  }
  const IndexTensor& index(const std::string& name) const {
    auto it = indices.find(name);
    if (it == indices.end())
      throw GoldenError("golden fixture '" + path + "': no index tensor named '" + name + "'");
    return it->second;
  }
  double scalar(const std::string& name) const {
    auto it = scalars.find(name);
    if (it == scalars.end())
      throw GoldenError("golden fixture '" + path + "': no scalar named '" + name + "'");
    return it->second;
  }
};

std::vector<std::string> split_ws(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string tok; in >> tok;) out.push_back(tok);
  return out;
}

// Parses a whole token as a number; false on trailing garbage or overflow.
bool parse_float(const std::string& tok, float* out) {
  errno = 0;
  char* end = nullptr;
  *out = std::strtof(tok.c_str(), &end);
  return end == tok.c_str() + tok.size() && !tok.empty() && errno == 0;
}
bool parse_double(const std::string& tok, double* out) {
  errno = 0;
  char* end = nullptr;
  *out = std::strtod(tok.c_str(), &end);
  return end == tok.c_str() + tok.size() && !tok.empty() && errno == 0;
}
bool parse_int(const std::string& tok, long long* out) {
  errno = 0;
  char* end = nullptr;
  *out = std::strtoll(tok.c_str(), &end, 10);
  return end == tok.c_str() + tok.size() && !tok.empty() && errno == 0;
}

[[maybe_unused]] Golden load_golden_file(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw GoldenError("golden fixture '" + path +
                      "' is missing or unreadable (regenerate with /usr/bin/python3 "
                      "tests/fixtures/make_golden.py)");
  Golden g;
  g.path = path;
  int lineno = 0;
  auto fail = [&](const std::string& what) -> GoldenError {
    return GoldenError("golden fixture '" + path + "' line " + std::to_string(lineno) +
                       ": malformed: " + what);
  };
  auto next_line = [&](std::string* line) {
    while (std::getline(in, *line)) {
      ++lineno;
      if (!line->empty() && line->back() == '\r') line->pop_back();
      const auto first = line->find_first_not_of(" \t");
      if (first == std::string::npos || (*line)[first] == '#') continue;
      return true;
    }
    return false;
  };
  std::string line;
  while (next_line(&line)) {
    const std::vector<std::string> head = split_ws(line);
    const std::string& kind = head[0];
    if (head.size() < 2) throw fail("expected '" + kind + " NAME ...', got '" + line + "'");
    const std::string& name = head[1];
    if (g.tensors.count(name) || g.indices.count(name) || g.scalars.count(name))
      throw fail("duplicate name '" + name + "'");
    if (kind == "scalar") {
      double v = 0;
      if (head.size() != 3 || !parse_double(head[2], &v))
        throw fail("expected 'scalar NAME value', got '" + line + "'");
      g.scalars[name] = v;
      continue;
    }
    if (kind != "tensor" && kind != "index")
      throw fail("unknown entry kind '" + kind + "' (expected tensor, index or scalar)");
    std::vector<int64_t> dims;
    for (size_t i = 2; i < head.size(); ++i) {
      long long d = 0;
      if (!parse_int(head[i], &d) || d < 0)
        throw fail("bad dim '" + head[i] + "' for '" + name + "'");
      dims.push_back(d);
    }
    if (static_cast<int>(dims.size()) > kMaxRank) throw fail("rank too high for '" + name + "'");
    const Shape shape(dims);
    const int header_line = lineno;
    if (!next_line(&line))
      throw fail("'" + name + "' (declared on line " + std::to_string(header_line) +
                 ") has no value line");
    const std::vector<std::string> toks = split_ws(line);
    if (static_cast<int64_t>(toks.size()) != shape.numel())
      throw fail("'" + name + "' of shape " + shape.str() + " needs " +
                 std::to_string(shape.numel()) + " values, found " + std::to_string(toks.size()));
    if (kind == "tensor") {
      std::vector<Scalar> values(toks.size());
      for (size_t i = 0; i < toks.size(); ++i)
        if (!parse_float(toks[i], &values[i]))
          throw fail("bad value '" + toks[i] + "' at position " + std::to_string(i) + " of '" +
                     name + "'");
      g.tensors[name] = Tensor::from(shape, values);
    } else {
      std::vector<int32_t> values(toks.size());
      for (size_t i = 0; i < toks.size(); ++i) {
        long long v = 0;
        if (!parse_int(toks[i], &v) || v < std::numeric_limits<int32_t>::min() ||
            v > std::numeric_limits<int32_t>::max())
          throw fail("bad integer '" + toks[i] + "' at position " + std::to_string(i) + " of '" +
                     name + "'");
        values[i] = static_cast<int32_t>(v);
      }
      g.indices[name] = IndexTensor(shape, values);
    }
  }
  return g;
}

// ---- comparison ---------------------------------------------------------------

std::string index_string(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.rank());
  for (int d = shape.rank() - 1; d >= 0; --d) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < idx.size(); ++i) out << (i ? ", " : "") << idx[i];
  out << "]";
  return out.str();
}

// Empty when |actual - expected| <= rel_tol * max(1, |expected|) everywhere
// (NaN never passes); otherwise a message naming `what`, the number of bad
// elements and the worst one with its index.
std::optional<std::string> compare(const Tensor& actual, const Tensor& expected, const std::string& what,
                                   double rel_tol = kRelTol) {
  std::ostringstream msg;
  msg.precision(9);
  if (!actual.defined()) return what + ": result is undefined";
  if (actual.shape() != expected.shape()) {
    msg << what << ": shape " << actual.shape() << " but expected " << expected.shape();
    return msg.str();
  }
  const std::vector<Scalar> a = actual.to_vector(), b = expected.to_vector();
  int64_t bad = 0, worst = -1;
  double worst_ratio = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    const double bound = rel_tol * std::max(1.0, std::abs(y));
    const double err = std::abs(x - y);
    const double ratio = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / bound;
    if (!(err <= bound)) ++bad;  // NaN counts as bad
    if (ratio > worst_ratio) worst_ratio = ratio, worst = static_cast<int64_t>(i);
  }
  if (bad == 0) return std::nullopt;
  msg << what << ": " << bad << " of " << a.size()
      << " elements differ beyond |a - b| <= " << rel_tol << " * max(1, |b|); worst at "
      << index_string(worst, expected.shape()) << ": got " << a[worst] << ", expected "
      << b[worst] << " (|a - b| = " << std::abs(static_cast<double>(a[worst]) - b[worst])
      << ", " << worst_ratio << "x the bound)";
  return msg.str();
}

[[maybe_unused]] void check_close(const Tensor& actual, const Tensor& expected, const std::string& what,
                                  double rel_tol = kRelTol) {
  if (auto failure = compare(actual, expected, what, rel_tol)) FAIL_CHECK(*failure);
}

}  // namespace
