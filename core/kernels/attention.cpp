#include "core/kernels/attention.h"

#include <cmath>
#include <limits>

#include "core/eigen.h"
#include "core/parallel.h"

namespace tapeformer::kernels {
namespace {

// Views of one (b, h) slice. Rows of Q/K/V/O are strided by 3C (or C).
struct Head {
  int64_t b, h;
};

}  // namespace

void causal_attention_forward(const Scalar* qkv, Scalar* y, Scalar* probs, const Scalar* keep,
                              const AttentionShape& s) {
  const int64_t C = s.H * s.D, T = s.T, D = s.D;
  const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(D));
  parallel::parallel_for(s.B * s.H, 1, [&](int64_t w0, int64_t w1) {
    eigen::RowMatrix pk;  // (T, T) probabilities after dropout
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / s.H, h = w % s.H;
      const Scalar* base = qkv + b * T * 3 * C + h * D;
      auto q = eigen::matrix(base, T, D, 3 * C);          // (T, D)
      auto k = eigen::matrix(base + C, T, D, 3 * C);      // (T, D)
      auto v = eigen::matrix(base + 2 * C, T, D, 3 * C);  // (T, D)
      auto p = eigen::matrix(probs + w * T * T, T, T);    // (T, T)
      p.noalias() = (q * k.transpose()) * scale;
      for (int64_t i = 0; i < T; ++i) {
        // Row i sees keys 0..i: it always holds its own diagonal, so it is
        // never empty; the future is exactly 0 after the softmax.
        auto row = p.row(i).head(i + 1).array();
        row = (row - row.maxCoeff()).exp();
        row /= row.sum();
        p.row(i).tail(T - i - 1).setZero();
      }
      auto o = eigen::matrix(y + b * T * C + h * D, T, D, C);  // (T, D)
      if (keep) {
        pk = p.array() * eigen::matrix(keep + w * T * T, T, T).array();
        o.noalias() = pk * v;
      } else {
        o.noalias() = p * v;
      }
    }
  });
}

void causal_attention_backward(const Scalar* qkv, const Scalar* probs, const Scalar* keep,
                               const Scalar* dy, Scalar* dqkv, const AttentionShape& s) {
  const int64_t C = s.H * s.D, T = s.T, D = s.D;
  const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(D));
  parallel::parallel_for(s.B * s.H, 1, [&](int64_t w0, int64_t w1) {
    eigen::RowMatrix dp, pk;  // (T, T)
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / s.H, h = w % s.H;
      const Scalar* base = qkv + b * T * 3 * C + h * D;
      Scalar* dbase = dqkv + b * T * 3 * C + h * D;
      auto q = eigen::matrix(base, T, D, 3 * C);
      auto k = eigen::matrix(base + C, T, D, 3 * C);
      auto v = eigen::matrix(base + 2 * C, T, D, 3 * C);
      auto dq = eigen::matrix(dbase, T, D, 3 * C);
      auto dk = eigen::matrix(dbase + C, T, D, 3 * C);
      auto dv = eigen::matrix(dbase + 2 * C, T, D, 3 * C);
      auto p = eigen::matrix(probs + w * T * T, T, T);
      auto dout = eigen::matrix(dy + b * T * C + h * D, T, D, C);  // (T, D)
      dp.noalias() = dout * v.transpose();                          // dP~ (T, T)
      if (keep) {
        auto kp = eigen::matrix(keep + w * T * T, T, T).array();
        pk = p.array() * kp;
        dv.noalias() = pk.transpose() * dout;
        dp.array() *= kp;  // dP = dP~ * keep
      } else {
        dv.noalias() = p.transpose() * dout;
      }
      // dS = P * (dP - rowsum(P * dP)); masked entries have P = 0, so dS = 0 there.
      const eigen::Array row_dot = (p.array() * dp.array()).rowwise().sum();
      dp = (p.array() * (dp.array().colwise() - row_dot)).matrix();
      dq.noalias() = (dp * k) * scale;
      dk.noalias() = (dp.transpose() * q) * scale;
    }
  });
}

}  // namespace tapeformer::kernels
