// The part the packed kernels share (packed_gemm.cpp: AVX2, packed16_gemm.cpp: AVX-512; their fp16-weight
// variants packed8h_gemm.cpp and packed16h_gemm.cpp use the packing and the checks): the packing and the
// micro-kernel, written once over a vector type V (Avx2 or Avx512 below) so that each source compiles it for its ISA.
//
// W [N, K] is packed once at load into blocks of V::NB output rows laid out [N / NB, K, NB], so each block is one
// contiguous stream. micro<V, R> keeps R rows of x in R vector accumulators and reads a block once per R rows;
// every output element is one sequential FMA chain over k whatever R, V or the batch is, so a row's result is
// bit-equal across batches and across the two kernels. The block streams from memory while the FMAs run: each
// step prefetches `pf` floats ahead (cpu_kernels.py measures the distance per row bucket at load).
#pragma once
#include <torch/extension.h>
#include <immintrin.h>

struct Avx2 {
  using reg = __m256;
  static constexpr int64_t NB = 8;  // output rows per packed block: one AVX2 vector
  static inline reg zero() { return _mm256_setzero_ps(); }
  static inline reg load(const float* p) { return _mm256_loadu_ps(p); }
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
  static inline reg bcast(const float* p) { return _mm512_set1_ps(*p); }
  static inline reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static inline void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
};
#endif

template <class V>
torch::Tensor pack_blocks(torch::Tensor w) {
  constexpr int64_t NB = V::NB;
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.size(0) % NB == 0,
              "fp32 [N, K] with N a multiple of ", NB);
  const int64_t N = w.size(0), K = w.size(1);
  return w.contiguous().view({N / NB, NB, K}).transpose(1, 2).contiguous();  // [N / NB, K, NB]
}

// Y[r, 0:NB] = X[r, :] . block for r < R; X [R, K] (row stride K), P one block [K, NB], Y row stride N.
template <class V, int R>
static inline void micro(const float* X, int64_t K, const float* P, float* Y, int64_t N, int64_t pf) {
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

// The shared argument checks and output of packed_linear: x [M, K] fp32 contiguous, p [N / NB, K, NB] of `weights`
// (fp32, or fp16 for the kernels that read fp16 copies of a drafter's weights).
template <class V>
torch::Tensor packed_output(torch::Tensor& x, const torch::Tensor& p, int64_t prefetch,
                            at::ScalarType weights = at::kFloat) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "fp32 [M, K]");
  x = x.contiguous();
  TORCH_CHECK(p.dim() == 3 && p.scalar_type() == weights && p.size(1) == x.size(1) && p.size(2) == V::NB,
              "packed ", weights, " weight [N / ", V::NB, ", K, ", V::NB, "]");
  TORCH_CHECK(prefetch >= 0, "prefetch distance >= 0");
  return torch::empty({x.size(0), p.size(0) * V::NB}, x.options());
}
