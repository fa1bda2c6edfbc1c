// packed_gemm.cpp's kernel reading fp16 copies of the weights, for AVX2 + F16C (treegraft/cpu_kernels.py, path
// "packed8h"): packed16h_gemm.cpp's counterpart on CPUs without AVX-512, for a drafter only. W is packed once at load
// into blocks of 8 output rows, [N / 8, K, 8] in fp16; each k step widens one block row to fp32 (vcvtph2ps) and runs
// the same fp32 FMA chain over k as the fp32 kernels, so on weights already rounded to fp16 a row's result is
// bit-equal to packed_gemm.cpp's and does not depend on its batch. Half the bytes a draft head call streams: the
// call runs after the target's verification has evicted the head's weights from the caches.
// The AVX2 kernel's tiles and micro-kernel (packed_micro.h) on fp16 blocks: 1-2 rows read 4 blocks side by side,
// 3-6 rows 2, 7-8 rows one; more rows go 8 at a time.
#include "packed_micro.h"
#include <ATen/Parallel.h>

using V = Avx2;
constexpr int64_t NB = V::NB;

torch::Tensor pack(torch::Tensor w) { return pack_blocks<V, at::Half>(w); }  // [N / 8, K, 8] fp16

// R rows against blocks [b0, b1): 1-2 rows 4 blocks a tile, 3-6 rows 2 (enough independent chains to cover the FMA's
// latency), 7-8 rows one pass of micro.
template <int R>
static void rows(const float* X, int64_t K, const at::Half* P, float* Y, int64_t N, int64_t b0, int64_t b1,
                 int64_t pf) {
  if constexpr (R >= 7) {
    for (int64_t b = b0; b < b1; ++b) micro<V, R, at::Half>(X, K, P + b * K * NB, Y + b * NB, N, pf);
  } else {
    over_blocks<V, R, R <= 2 ? 4 : 2, at::Half>(X, K, P, Y, N, b0, b1, pf);
  }
}

torch::Tensor packed_linear(torch::Tensor x, torch::Tensor p, int64_t prefetch) {
  auto y = packed_output<V, at::Half>(x, p, prefetch);
  const int64_t M = x.size(0), K = x.size(1), blocks = p.size(0), N = blocks * NB;
  const float* X = x.data_ptr<float>();
  const at::Half* P = p.data_ptr<at::Half>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, blocks, 8, [&](int64_t b0, int64_t b1) {
    for (int64_t m = 0; m < M; m += 8) {
      const float* xm = X + m * K;
      float* ym = Y + m * N;
      switch (std::min<int64_t>(8, M - m)) {
        case 8: rows<8>(xm, K, P, ym, N, b0, b1, prefetch); break;
        case 7: rows<7>(xm, K, P, ym, N, b0, b1, prefetch); break;
        case 6: rows<6>(xm, K, P, ym, N, b0, b1, prefetch); break;
        case 5: rows<5>(xm, K, P, ym, N, b0, b1, prefetch); break;
        case 4: rows<4>(xm, K, P, ym, N, b0, b1, prefetch); break;
        case 3: rows<3>(xm, K, P, ym, N, b0, b1, prefetch); break;
        case 2: rows<2>(xm, K, P, ym, N, b0, b1, prefetch); break;
        default: rows<1>(xm, K, P, ym, N, b0, b1, prefetch); break;
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "W [N, K] fp32 -> packed fp16 [N / 8, K, 8]");
  m.def("packed_linear", &packed_linear, "x [M, K] . W^T from the packed fp16 W, prefetching `prefetch` elements ahead",
        py::arg("x"), py::arg("p"), py::arg("prefetch"));
}
