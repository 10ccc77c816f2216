#include "tapeformer/layers/memory/external_memory.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {

namespace {
// (B, H, T, D) -> (B, T, H D), heads side by side.
Tensor heads_side_by_side(const Tensor& x) {
  return x.permute({0, 2, 1, 3}).contiguous().reshape({x.dim(0), x.dim(2), x.dim(1) * x.dim(3)});
}
}  // namespace

void ExternalMemory::append(const Tensor& k, const Tensor& v) {
  TAPEFORMER_CHECK(keys != nullptr && values != nullptr && capacity > 0, "ExternalMemory: no storage or capacity");
  TAPEFORMER_CHECK(k.rank() == 4 && k.shape() == v.shape(), "ExternalMemory: keys ", k.shape(), " and values ",
                   v.shape(), " must be (B, H, T, D) alike");
  const auto grow = [&](Tensor& store, const Tensor& add) {
    const Tensor rows = heads_side_by_side(add);  // (B, T, C)
    TAPEFORMER_CHECK(!store.defined() || (store.dim(0) == rows.dim(0) && store.dim(2) == rows.dim(2)),
                     "ExternalMemory: rows ", rows.shape(), " for a memory of ", store.shape());
    const Tensor all = store.defined() && store.dim(1) > 0 ? concat({Var(store), Var(rows)}, 1).value() : rows;
    const int64_t n = all.dim(1), kept = std::min(n, capacity);
    store = all.slice(1, n - kept, n).contiguous();  // a new tensor: copies of the memory stay as they were
  };
  // Unit keys per head: the search by dot product ranks by cosine, and keys
  // stored under older weights keep the scale of newer ones.
  const Tensor kc = k.contiguous();
  Tensor unit = Tensor::empty(kc.shape());
  const int64_t D = kc.dim(3);
  for (int64_t r = 0; r < kc.numel() / D; ++r) {
    const Scalar* src = kc.data() + r * D;
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(src[d]) * src[d];
    const auto inv = static_cast<Scalar>(1.0 / std::sqrt(ss + 1e-12));
    for (int64_t d = 0; d < D; ++d) unit.data()[r * D + d] = src[d] * inv;
  }
  grow(*keys, unit);
  grow(*values, v);
}

std::vector<int32_t> ExternalMemory::search(const Tensor& q_in) const {
  const int64_t N = length();
  TAPEFORMER_CHECK(N > 0, "ExternalMemory: search in an empty memory");
  const Tensor q = q_in.contiguous(), K = keys->contiguous();
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), D = q.dim(3), C = K.dim(2), k = std::min(top_k, N);
  TAPEFORMER_CHECK(K.dim(0) == B && C == H * D, "ExternalMemory: queries ", q.shape(), " for keys ", K.shape());
  std::vector<int32_t> out(static_cast<size_t>(B * H * T * k));
  parallel::parallel_for(B * H, 1, [&](int64_t r0, int64_t r1) {
    eigen::RowMatrix scores(T, N);  // one sequence and head: q . k_j for every query and stored key
    std::vector<int32_t> order(static_cast<size_t>(N));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / H, h = r % H;
      // float32 products summed in order of d: the same scores on every machine.
      kernels::gemm_fp32({q.data() + r * T * D, T, D, D, 1}, {K.data() + b * N * C + h * D, D, N, 1, C},
                         scores.data(), N, false);
      for (int64_t t = 0; t < T; ++t) {
        const Scalar* s = scores.data() + t * N;
        std::iota(order.begin(), order.end(), 0);
        // Highest first, ties to the lower index: the same pairs whatever the sort does.
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int32_t a, int32_t c) { return s[a] > s[c] || (s[a] == s[c] && a < c); });
        std::copy(order.begin(), order.begin() + k, out.begin() + (r * T + t) * k);
      }
    }
  });
  return out;
}

Var retrieved_attention(const Var& q, const ExternalMemory& memory, const Var& log_scale) {
  TAPEFORMER_CHECK(q.rank() == 4, "retrieved_attention: queries ", q.shape(), " must be (B, H, T, D)");
  TAPEFORMER_CHECK(log_scale.rank() == 1 && log_scale.dim(0) == q.dim(1), "retrieved_attention: log_scale ",
                   log_scale.shape(), " must be (H) for queries ", q.shape());
  const std::vector<int32_t> index = memory.search(q.value());
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), D = q.dim(3), N = memory.length(),
                k = std::min(memory.top_k, N), C = H * D;
  // The retrieved pairs, (B, H, T, k, D) each: constants.
  const Tensor K = memory.keys->contiguous(), V = memory.values->contiguous();
  Tensor kg = Tensor::empty({B, H, T, k, D}), vg = Tensor::empty({B, H, T, k, D});
  for (int64_t r = 0; r < B * H * T; ++r) {
    const int64_t b = r / (H * T), h = (r / T) % H;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t src = (b * N + index[static_cast<size_t>(r * k + j)]) * C + h * D, dst = (r * k + j) * D;
      std::copy(K.data() + src, K.data() + src + D, kg.data() + dst);
      std::copy(V.data() + src, V.data() + src + D, vg.data() + dst);
    }
  }
  // One query against its own k pairs: batched (1, D) x (D, k) and (1, k) x (k, D) products.
  const int64_t R = B * H * T;
  const Var unit_q = div(q, sqrt(add_scalar(sum(mul(q, q), {3}, /*keepdim=*/true), 1e-12f)));  // (B, H, T, D)
  const Var tau = reshape(exp(log_scale), {1, H, 1, 1});                                      // per head
  const Var scaled_q = mul(unit_q, tau);  // tau_h q / |q|
  const Var scores = matmul(reshape(scaled_q, {R, 1, D}), Var(kg.reshape({R, k, D}).transpose(1, 2)));  // (R, 1, k)
  const Var p = softmax(scores);                                           // over the k pairs
  return reshape(matmul(p, Var(vg.reshape({R, k, D}))), {B, H, T, D});     // (B, H, T, D)
}

}  // namespace tapeformer
