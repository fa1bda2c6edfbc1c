// The part the packed kernels share (packed_gemm.cpp: AVX2, packed16_gemm.cpp: AVX-512, and their fp16-weight
// variants packed8h_gemm.cpp and packed16h_gemm.cpp): the packing, the argument checks and the loops, written once
// over a vector type V (Avx2 or Avx512 below) and the weights' element type W (float, or at::Half for the fp16
// copies of a drafter's weights: V::load widens a block row to fp32, exactly), so that each source compiles them for
// its ISA and every kernel runs the same fp32 FMA chain per output.
//
// W [N, K] is packed once at load into blocks of V::NB output rows laid out [N / NB, K, NB], so each block is one
// contiguous stream. micro<V, R> keeps R rows of x in R vector accumulators and reads a block once per R rows;
// every output element is one sequential FMA chain over k whatever R, V or the batch is, so a row's result is
// bit-equal across batches and across the two kernels. The block streams from memory while the FMAs run: each
// step prefetches `pf` floats ahead (cpu_kernels.py measures the distance per row bucket at load).
#pragma once
#include <torch/extension.h>
#include <immintrin.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <type_traits>

struct Avx2 {
  using reg = __m256;
  static constexpr int64_t NB = 8;  // output rows per packed block: one AVX2 vector
  static inline reg zero() { return _mm256_setzero_ps(); }
  static inline reg load(const float* p) { return _mm256_loadu_ps(p); }
#ifdef __F16C__  // packed8h_gemm.cpp is built with -mf16c
  static inline reg load(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif
  static inline reg bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static inline reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static inline void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
};

#ifdef __AVX512F__  // packed16_gemm.cpp is built with -mavx512f
struct Avx512 {
  using reg = __m512;
  static constexpr int64_t NB = 16;  // output rows per packed block: one AVX-512 vector
  static inline reg zero() { return _mm512_setzero_ps(); }
  static inline reg load(const float* p) { return _mm512_loadu_ps(p); }
  static inline reg load(const at::Half* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static inline reg bcast(const float* p) { return _mm512_set1_ps(*p); }
  static inline reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static inline void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
};
#endif

// W [N, K] fp32 -> [N / NB, K, NB] of the weights' element type W (fp32, or fp16 copies of a drafter's weights).
template <class V, class W = float>
torch::Tensor pack_blocks(torch::Tensor w) {
  constexpr int64_t NB = V::NB;
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.size(0) % NB == 0,
              "fp32 [N, K] with N a multiple of ", NB);
  const int64_t N = w.size(0), K = w.size(1);
  auto p = w.contiguous().view({N / NB, NB, K}).transpose(1, 2).contiguous();  // [N / NB, K, NB]
  return std::is_same_v<W, float> ? p : p.to(at::kHalf);
}

// Y[r, 0:NB] = X[r, :] . block for r < R; X [R, K] (row stride K), P one block [K, NB], Y row stride N.
template <class V, int R, class W = float>
static inline void micro(const float* X, int64_t K, const W* P, float* Y, int64_t N, int64_t pf) {
  constexpr int64_t NB = V::NB;
  typename V::reg acc[R];
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(P + k * NB + pf), _MM_HINT_T0);
    const typename V::reg w = V::load(P + k * NB);
    for (int r = 0; r < R; ++r) acc[r] = V::fma(w, V::bcast(X + r * K + k), acc[r]);
  }
  for (int r = 0; r < R; ++r) V::store(Y + r * N, acc[r]);
}

// R rows x B blocks side by side, k unrolled by U so that each block's stream is prefetched once per U rows of the
// block: U = 2 for fp32 AVX2 blocks (two rows a 64-byte line), U = 1 for AVX-512 ones (a row is a line). B blocks
// share each broadcast of x (with 5 or more rows, micro's single block needs one broadcast load per FMA, and the
// two load ports, not the two FMA pipes, set the pace: a k step loads B + R vectors for B * R FMAs) and give B * R
// independent FMA chains. Each output is still the same FMA chain over k.
template <class V, int R, int B, class W = float, int U = 2>
static inline void tile(const float* X, int64_t K, const W* P, float* Y, int64_t N, int64_t pf) {
  constexpr int64_t NB = V::NB;
  typename V::reg acc[B][R];
  for (int b = 0; b < B; ++b)
    for (int r = 0; r < R; ++r) acc[b][r] = V::zero();
  const int64_t bs = K * NB;
  auto step = [&](int64_t k) {
    typename V::reg w[B];
    for (int b = 0; b < B; ++b) w[b] = V::load(P + b * bs + k * NB);
    for (int r = 0; r < R; ++r) {
      const typename V::reg x = V::bcast(X + r * K + k);
      for (int b = 0; b < B; ++b) acc[b][r] = V::fma(w[b], x, acc[b][r]);
    }
  };
  int64_t k = 0;
  for (; k + U <= K; k += U) {
    for (int b = 0; b < B; ++b) _mm_prefetch(reinterpret_cast<const char*>(P + b * bs + k * NB + pf), _MM_HINT_T0);
    for (int u = 0; u < U; ++u) step(k + u);
  }
  for (; k < K; ++k) step(k);
  for (int b = 0; b < B; ++b)
    for (int r = 0; r < R; ++r) V::store(Y + r * N + b * NB, acc[b][r]);
}

// R rows of x against blocks [b0, b1) (P the first block of all, blocks K * NB apart): B blocks a tile, the rest one
// block at a time.
template <class V, int R, int B, class W = float>
static void over_blocks(const float* X, int64_t K, const W* P, float* Y, int64_t N, int64_t b0, int64_t b1,
                        int64_t pf) {
  constexpr int64_t NB = V::NB;
  int64_t b = b0;
  for (; b + B <= b1; b += B) tile<V, R, B, W>(X, K, P + b * K * NB, Y + b * NB, N, pf);
  for (; b < b1; ++b) tile<V, R, 1, W>(X, K, P + b * K * NB, Y + b * NB, N, pf);
}

// The shared argument checks and output of packed_linear: x [M, K] fp32 contiguous, p [N / NB, K, NB] of W.
template <class V, class W = float>
torch::Tensor packed_output(torch::Tensor& x, const torch::Tensor& p, int64_t prefetch) {
  const auto weights = std::is_same_v<W, float> ? at::kFloat : at::kHalf;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "fp32 [M, K]");
  x = x.contiguous();
  TORCH_CHECK(p.dim() == 3 && p.scalar_type() == weights && p.size(1) == x.size(1) && p.size(2) == V::NB,
              "packed ", weights, " weight [N / ", V::NB, ", K, ", V::NB, "]");
  TORCH_CHECK(prefetch >= 0, "prefetch distance >= 0");
  return torch::empty({x.size(0), p.size(0) * V::NB}, x.options());
}

// tile<V, R, B, W, 1> for a run-time R in 1..16: one pass over B blocks for all R rows. Two blocks take at most 12
// rows (24 accumulators + 2 weights + x of the 32 zmm registers; callers never ask for more), one block 16.
template <class V, int R, int B, class W>
static inline void pass_of(const float* X, int64_t K, const W* P, float* Y, int64_t N, int64_t pf) {
  if constexpr (B * R <= 24) tile<V, R, B, W, 1>(X, K, P, Y, N, pf);
}

template <class V, int B, class W>
static inline void pass_rows(int64_t rows, const float* X, int64_t K, const W* P, float* Y, int64_t N, int64_t pf) {
  switch (rows) {
    case 16: pass_of<V, 16, B, W>(X, K, P, Y, N, pf); break;
    case 15: pass_of<V, 15, B, W>(X, K, P, Y, N, pf); break;
    case 14: pass_of<V, 14, B, W>(X, K, P, Y, N, pf); break;
    case 13: pass_of<V, 13, B, W>(X, K, P, Y, N, pf); break;
    case 12: pass_of<V, 12, B, W>(X, K, P, Y, N, pf); break;
    case 11: pass_of<V, 11, B, W>(X, K, P, Y, N, pf); break;
    case 10: pass_of<V, 10, B, W>(X, K, P, Y, N, pf); break;
    case 9: pass_of<V, 9, B, W>(X, K, P, Y, N, pf); break;
    case 8: pass_of<V, 8, B, W>(X, K, P, Y, N, pf); break;
    case 7: pass_of<V, 7, B, W>(X, K, P, Y, N, pf); break;
    case 6: pass_of<V, 6, B, W>(X, K, P, Y, N, pf); break;
    case 5: pass_of<V, 5, B, W>(X, K, P, Y, N, pf); break;
    case 4: pass_of<V, 4, B, W>(X, K, P, Y, N, pf); break;
    case 3: pass_of<V, 3, B, W>(X, K, P, Y, N, pf); break;
    case 2: pass_of<V, 2, B, W>(X, K, P, Y, N, pf); break;
    default: pass_of<V, 1, B, W>(X, K, P, Y, N, pf); break;
  }
}

// y = x . W^T: the AVX-512 kernels (packed16 on fp32 weights, packed16h on fp16 copies). Up to 64 rows (every batch
// of a verification or a drafter's call): pairs of blocks, each broadcast of x feeding both (`tile<R, 2>`), the rows
// in passes of at most 12 as even as possible (the first from memory, the others from L2). Longer batches (a
// prompt's prefill): one block at a time, 16 rows a pass, the rest in one pass. On a 2-core Intel Xeon with
// AVX-512 (fp32, a 1,536 x 576 layer streamed from memory, the old and new builds side by side in one process), against
// one block at a time in passes of 16, 8, 4 and 1 rows (the loop until 2026-12-05): 1-12 rows 0.14-0.17 -> 0.12
// ms (flat: the weight stream sets the pace), 16 rows 0.18 -> 0.17, 24 0.24 -> 0.20, 64 0.53 -> 0.44; 256 level.
// One block and the rest in one pass (without pairs) had taken 5-7 rows from 0.19-0.25 to 0.16 ms; passes of
// 16 + 4 beat 10 + 10 there, with one block (docs/tuning.md).
//
// `full_first` (path "packed16f"): the passes are 12 rows each and the rest last (16 = 12 + 4, 13 = 12 + 1) instead of
// as even as possible (16 = 8 + 8, 13 = 7 + 6); the same FMA chains, so bit-equal. On a 2-core Zen 4 EPYC (a 1,536 x
// 576 layer streamed from memory, interleaved, 2026-12-06) 16 rows 0.185 -> 0.158 ms and 13 rows 0.166 -> 0.145 ms,
// 14 and 20-24 level; which split a host takes is measured at load like any path.
template <class V, class W>
torch::Tensor micro_linear(torch::Tensor x, torch::Tensor p, int64_t prefetch, bool full_first = false) {
  constexpr int64_t NB = V::NB;
  torch::Tensor y = packed_output<V, W>(x, p, prefetch);
  const int64_t M = x.size(0), K = x.size(1), blocks = p.size(0), N = blocks * NB;
  const float* X = x.data_ptr<float>();
  const W* P = reinterpret_cast<const W*>(p.data_ptr());
  float* Y = y.data_ptr<float>();
  if (M <= 64) {  // pairs of blocks (an odd last block alone), the rows in passes of at most 12, as even as possible
    const int64_t passes = (M + 11) / 12;
    at::parallel_for(0, (blocks + 1) / 2, 2, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const W* pq = P + 2 * q * K * NB;
        for (int64_t t = 0, m = 0; t < passes; ++t) {
          const int64_t r = full_first ? std::min<int64_t>(12, M - m) : M / passes + (t < M % passes ? 1 : 0);
          float* yq = Y + m * N + 2 * q * NB;
          if (2 * q + 1 < blocks) pass_rows<V, 2, W>(r, X + m * K, K, pq, yq, N, prefetch);
          else pass_rows<V, 1, W>(r, X + m * K, K, pq, yq, N, prefetch);
          m += r;
        }
      }
    });
    return y;
  }
  at::parallel_for(0, blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const W* pb = P + b * K * NB;
      float* yb = Y + b * NB;
      for (int64_t m = 0; m < M; m += 16)
        pass_rows<V, 1, W>(std::min<int64_t>(16, M - m), X + m * K, K, pb, yb + m * N, N, prefetch);
    }
  });
  return y;
}
