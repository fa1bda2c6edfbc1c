// Few-row fp32 Linear for speculative verification on x86 CPUs with AVX2 + FMA (treegraft/cpu_kernels.py).
//
// y[M, N] = x[M, K] . W[N, K]^T. W is packed once at load into blocks of NB = 8 output rows laid out
// [N / NB, K, NB], so each block is one contiguous stream; a micro-kernel keeps up to 8 rows of x in
// 8 AVX2 accumulators and reads each block once per 8 rows (the 1-row path of BLAS reads W once per row
// too, but a general GEMM kernel for 2-16 rows is far from the memory bound on a few cores).
// With 1-4 rows, one accumulator per row and block would leave the FMA units waiting on each chain's latency,
// so up to 4 blocks are read side by side (tile): 1.3-1.7x faster at 1-4 rows on a 2-core AVX2 EPYC
// (a 1536 x 576 layer, idle). 7-12 rows take micro, one pass a block: there the weights' stream from memory
// sets the pace, and a second pass over a block (tiles) leaves the stream idle while it runs. 5-6 and 13+ rows
// take tiles of 4-6 rows x 2-3 blocks (tile): micro's one block needs a broadcast load per FMA, so the load ports
// set its pace; a tile shares each broadcast across its blocks (0.26 -> 0.23 ms at 16 rows on a 2-core Zen 2 EPYC).
// The weight streams from memory while the FMAs run: each step prefetches the block `prefetch` floats ahead. With
// many rows a k step takes longer, so the stream needs a longer lead to stay ahead of the arithmetic: 128 floats
// left 8 rows ~1.3x slower than 512-1024 on a 2-core Zen 4 EPYC (weights out of cache); cpu_kernels.py measures
// the distance per row bucket at load.
// Every output element is the same sequential FMA chain over k whatever M is, so a row's result does
// not depend on the batch it was computed in. Threads split the blocks (ATen's intra-op pool; the extension is
// built with -fopenmp, without which at::parallel_for runs serially here: threads_used() says which it is).
// pack(), micro() and tile() are written once for the packed kernels, over the vector width and the weights' type
// (packed_micro.h).
#include "packed_micro.h"
#include <ATen/Parallel.h>
#include <algorithm>
#include <numeric>
#include <vector>

using V = Avx2;
constexpr int64_t NB = V::NB;

torch::Tensor pack(torch::Tensor w) { return pack_blocks<V>(w); }

// Which tile a row count takes (over_blocks, packed_micro.h): B * R independent accumulators hide the FMA's latency
// (one row alone is one chain per block): 1-2 rows take 4 blocks, 3-4 rows 2 (few_rows: 1.3-1.7x faster at 1-4 rows
// than one block a pass), 5-6 rows 2 and 4 rows among more 3 (row_tile: 10-12 accumulators keep both FMA pipes busy;
// 4 rows x 3 blocks spill at 1-4 rows alone).
template <int R>
static void few_rows(const float* X, int64_t K, const float* P, float* Y, int64_t N, int64_t b0, int64_t b1,
                     int64_t pf) {
  over_blocks<V, R, R <= 2 ? 4 : 2>(X, K, P, Y, N, b0, b1, pf);
}
template <int R>
static void row_tile(const float* X, int64_t K, const float* P, float* Y, int64_t N, int64_t b0, int64_t b1,
                     int64_t pf) {
  over_blocks<V, R, R >= 5 ? 2 : 3>(X, K, P, Y, N, b0, b1, pf);
}

torch::Tensor packed_linear(torch::Tensor x, torch::Tensor p, int64_t prefetch) {
  auto y = packed_output<V>(x, p, prefetch);
  const int64_t M = x.size(0), K = x.size(1), blocks = p.size(0), N = blocks * NB, pf = prefetch;
  const float* X = x.data_ptr<float>();
  const float* P = p.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  if (M <= 4) {
    at::parallel_for(0, blocks, 8, [&](int64_t b0, int64_t b1) {
      switch (M) {
        case 4: few_rows<4>(X, K, P, Y, N, b0, b1, pf); break;
        case 3: few_rows<3>(X, K, P, Y, N, b0, b1, pf); break;
        case 2: few_rows<2>(X, K, P, Y, N, b0, b1, pf); break;
        default: few_rows<1>(X, K, P, Y, N, b0, b1, pf); break;
      }
    });
    return y;
  }
  // 7-12 rows: one pass of micro over each block. Tiles (below) were slower at 7-8 rows (4 + 4 or 4 + 3), and at
  // 9-12 two passes over each group left the memory stream idle during the second: a 1536 x 576 layer streamed
  // from memory on a 2-core Zen 2 EPYC, 9 / 10 / 11 / 12 rows 0.17 / 0.17 / 0.17 / 0.18 ms -> 0.14 / 0.15 / 0.16 /
  // 0.17 (micro<13> and up, or two passes of micro<8>, were slower than tiles).
  if (M >= 7 && M <= 12) {
    at::parallel_for(0, blocks, 8, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const float* pb = P + b * K * NB;
        float* yb = Y + b * NB;
        switch (M) {
          case 12: micro<V, 12>(X, K, pb, yb, N, pf); break;
          case 11: micro<V, 11>(X, K, pb, yb, N, pf); break;
          case 10: micro<V, 10>(X, K, pb, yb, N, pf); break;
          case 9: micro<V, 9>(X, K, pb, yb, N, pf); break;
          case 8: micro<V, 8>(X, K, pb, yb, N, pf); break;
          default: micro<V, 7>(X, K, pb, yb, N, pf); break;
        }
      }
    });
    return y;
  }
  // 5, 6 or 13+ rows: tiles of at most TR rows, as even as possible (16 = 6 + 5 + 5), each over a group of G blocks
  // that stays in the core's L2 while the tiles read it. On a 2-core AVX2 EPYC (Zen 2), weights out of cache, a
  // 1536 x 576 layer: 0.26 -> 0.23 ms at 16 rows, 0.91 -> 0.75 at 64; bit-equal results.
  constexpr int64_t TR = 6, G = 6;
  const int64_t tiles = (M + TR - 1) / TR;
  at::parallel_for(0, (blocks + G - 1) / G, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t b0 = g * G, b1 = std::min(blocks, b0 + G);
      int64_t m = 0;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t r = M / tiles + (t < M % tiles ? 1 : 0);  // 4-6 rows (M >= 4 * ceil(M / 6) for M >= 9)
        const float* xm = X + m * K;
        float* ym = Y + m * N;
        switch (r) {
          case 6: row_tile<6>(xm, K, P, ym, N, b0, b1, pf); break;
          case 5: row_tile<5>(xm, K, P, ym, N, b0, b1, pf); break;
          default: row_tile<4>(xm, K, P, ym, N, b0, b1, pf); break;
        }
        m += r;
      }
    }
  });
  return y;
}

// How many distinct intra-op threads a parallel_for over the blocks of a head-sized weight runs on.
int64_t threads_used() {
  std::vector<int> ran(at::get_num_threads(), 0);
  at::parallel_for(0, 6144, 8, [&](int64_t, int64_t) { ran[at::get_thread_num()] = 1; });
  return std::accumulate(ran.begin(), ran.end(), int64_t{0});
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("threads_used", &threads_used, "distinct intra-op threads a parallel_for over the blocks runs on");
  m.def("pack", &pack, "W [N, K] -> packed [N / 8, K, 8]");
  m.def("packed_linear", &packed_linear, "x [M, K] . W^T from the packed W, prefetching `prefetch` floats ahead",
        py::arg("x"), py::arg("p"), py::arg("prefetch"));
}
