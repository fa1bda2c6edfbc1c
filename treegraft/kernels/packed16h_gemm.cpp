// packed16_gemm.cpp's kernel reading fp16 copies of the weights (treegraft/cpu_kernels.py, path "packed16h"): for a
// drafter only. Its products are fp32 FMA chains over k, as packed16's, on weights rounded to fp16 (relative error
// <= 2^-11), so a row's result still does not depend on the batch it is in; the target never takes this path (its
// greedy output must equal plain fp32 decoding). Half the bytes a draft head call streams: a call runs after the
// target's verification has evicted the head's weights from the caches, so it reads them from memory.
// W is packed once at load into blocks of 16 output rows, [N / 16, K, 16] in fp16; each k step widens one block row
// to fp32 (vcvtph2ps, AVX-512F) and prefetches `prefetch` elements ahead.
#include "packed_micro.h"
#include <ATen/Parallel.h>

constexpr int64_t NB = Avx512::NB;

torch::Tensor pack(torch::Tensor w) { return pack_blocks<Avx512>(w).to(at::kHalf); }  // [N / 16, K, 16] fp16

template <int R>
static inline void micro(const float* X, int64_t K, const at::Half* P, float* Y, int64_t N, int64_t pf) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(P + k * NB + pf), _MM_HINT_T0);
    const __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(P + k * NB)));
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(X[r * K + k]), acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(Y + r * N, acc[r]);
}

torch::Tensor packed_linear(torch::Tensor x, torch::Tensor p, int64_t prefetch) {
  auto y = packed_output<Avx512>(x, p, prefetch, at::kHalf);
  const int64_t M = x.size(0), K = x.size(1), blocks = p.size(0), N = blocks * NB;
  const float* X = x.data_ptr<float>();
  const at::Half* P = p.data_ptr<at::Half>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const at::Half* pb = P + b * K * NB;
      float* yb = Y + b * NB;
      int64_t m = 0;
      for (; m + 16 <= M; m += 16) micro<16>(X + m * K, K, pb, yb + m * N, N, prefetch);
      for (; m + 8 <= M; m += 8) micro<8>(X + m * K, K, pb, yb + m * N, N, prefetch);
      for (; m + 4 <= M; m += 4) micro<4>(X + m * K, K, pb, yb + m * N, N, prefetch);
      for (; m < M; ++m) micro<1>(X + m * K, K, pb, yb + m * N, N, prefetch);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "W [N, K] fp32 -> packed fp16 [N / 16, K, 16]");
  m.def("packed_linear", &packed_linear, "x [M, K] . W^T from the packed fp16 W, prefetching `prefetch` elements ahead",
        py::arg("x"), py::arg("p"), py::arg("prefetch"));
}
