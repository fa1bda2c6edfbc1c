// packed16_gemm.cpp's kernel reading fp16 copies of the weights (treegraft/cpu_kernels.py, path "packed16h"): for a
// drafter only. Its products are fp32 FMA chains over k, as packed16's, on weights rounded to fp16 (relative error
// <= 2^-11), so a row's result still does not depend on the batch it is in; the target never takes this path (its
// greedy output must equal plain fp32 decoding). Half the bytes a draft head call streams: a call runs after the
// target's verification has evicted the head's weights from the caches, so it reads them from memory.
// W is packed once at load into blocks of 16 output rows, [N / 16, K, 16] in fp16; each k step widens one block row
// to fp32 (vcvtph2ps, AVX-512F) and prefetches `prefetch` elements ahead.
#include "packed_micro.h"

torch::Tensor pack(torch::Tensor w) { return pack_blocks<Avx512, at::Half>(w); }  // [N / 16, K, 16] fp16

torch::Tensor packed_linear(torch::Tensor x, torch::Tensor p, int64_t prefetch) {
  return micro_linear<Avx512, at::Half>(x, p, prefetch);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "W [N, K] fp32 -> packed fp16 [N / 16, K, 16]");
  m.def("packed_linear", &packed_linear, "x [M, K] . W^T from the packed fp16 W, prefetching `prefetch` elements ahead",
        py::arg("x"), py::arg("p"), py::arg("prefetch"));
}
