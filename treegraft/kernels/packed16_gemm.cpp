// The packed few-row fp32 Linear of packed_gemm.cpp for CPUs with AVX-512 (treegraft/cpu_kernels.py, path "packed16").
//
// W is packed once at load into blocks of NB = 16 output rows, laid out [N / 16, K, 16]; a micro-kernel keeps up to
// 16 rows of x in 16 zmm accumulators and reads each block once per 16 rows (the AVX2 kernel reads it once per 8).
// Every output element is the same sequential FMA chain over k as in the AVX2 kernel, so its results are bit-equal
// to that kernel's whatever the batch, and a tree row equals the row of a one-token forward. Measured on a 2-core
// Zen 4 EPYC, weights out of cache: 16 rows of a 1536 x 576 layer 205 us against the AVX2 kernel's 321 us.
// pack() and micro() are the AVX2 kernel's, instantiated for 16-float vectors (packed_micro.h).
#include "packed_micro.h"
#include <ATen/Parallel.h>

using V = Avx512;
constexpr int64_t NB = V::NB;

torch::Tensor pack(torch::Tensor w) { return pack_blocks<V>(w); }

torch::Tensor packed_linear(torch::Tensor x, torch::Tensor p, int64_t prefetch) {
  auto y = packed_output<V>(x, p, prefetch);
  const int64_t M = x.size(0), K = x.size(1), blocks = p.size(0), N = blocks * NB;
  const float* X = x.data_ptr<float>();
  const float* P = p.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* pb = P + b * K * NB;
      float* yb = Y + b * NB;
      int64_t m = 0;
      for (; m + 16 <= M; m += 16) micro<V, 16>(X + m * K, K, pb, yb + m * N, N, prefetch);
      for (; m + 8 <= M; m += 8) micro<V, 8>(X + m * K, K, pb, yb + m * N, N, prefetch);
      for (; m + 4 <= M; m += 4) micro<V, 4>(X + m * K, K, pb, yb + m * N, N, prefetch);
      for (; m < M; ++m) micro<V, 1>(X + m * K, K, pb, yb + m * N, N, prefetch);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "W [N, K] -> packed [N / 16, K, 16]");
  m.def("packed_linear", &packed_linear, "x [M, K] . W^T from the packed W, prefetching `prefetch` floats ahead",
        py::arg("x"), py::arg("p"), py::arg("prefetch"));
}
