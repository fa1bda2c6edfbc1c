// The packed few-row fp32 Linear of packed_gemm.cpp for CPUs with AVX-512 (treegraft/cpu_kernels.py, path "packed16").
//
// W is packed once at load into blocks of NB = 16 output rows, laid out [N / 16, K, 16]; a micro-kernel keeps up to
// 16 rows of x in 16 zmm accumulators and reads each block once per 16 rows (the AVX2 kernel reads it once per 8).
// Every output element is the same sequential FMA chain over k as in the AVX2 kernel, so its results are bit-equal
// to that kernel's whatever the batch, and a tree row equals the row of a one-token forward. Measured on a 2-core
// Zen 4 EPYC, weights out of cache: 16 rows of a 1536 x 576 layer 205 us against the AVX2 kernel's 321 us.
// pack() and micro() are the AVX2 kernel's, instantiated for 16-float vectors, and so is the loop over rows
// (micro_linear, shared with packed16h: packed_micro.h).
#include "packed_micro.h"

using V = Avx512;

torch::Tensor pack(torch::Tensor w) { return pack_blocks<V>(w); }

torch::Tensor packed_linear(torch::Tensor x, torch::Tensor p, int64_t prefetch) {
  return micro_linear<V, float>(x, p, prefetch);
}

// The same product with the rows in passes of 12 and the rest last (path "packed16f", packed_micro.h).
torch::Tensor packed_linear_full_first(torch::Tensor x, torch::Tensor p, int64_t prefetch) {
  return micro_linear<V, float>(x, p, prefetch, true);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "W [N, K] -> packed [N / 16, K, 16]");
  m.def("packed_linear", &packed_linear, "x [M, K] . W^T from the packed W, prefetching `prefetch` floats ahead",
        py::arg("x"), py::arg("p"), py::arg("prefetch"));
  m.def("packed_linear_full_first", &packed_linear_full_first, "packed_linear, its rows in passes of 12, the rest last",
        py::arg("x"), py::arg("p"), py::arg("prefetch"));
}
