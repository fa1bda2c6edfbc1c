// A draft head's whole forward as one call (treegraft/drafters/fused.py): fc over [feature; embedding], Llama-class
// decoder layers (RMSNorm, q/k/v, rotary, the cache's append, grouped-query attention under an additive tree mask,
// o, RMSNorm, SiLU-gated MLP) and the final RMSNorm, for the few rows of a drafting step.
//
// Why: a head step runs right after the target's verification has streamed ~0.5 GB through every cache, so each of
// the stock layer's ~45 small tensor ops (norms, rotary, views, the mask's softmax, the activation) pays for a cold
// interpreter, dispatcher and allocator: on a 2-core Zen 4 a live forward took 1.5 ms of which the products were ~0.7
// (docs/tuning.md). Here the small ops are plain loops over a few rows and the products are the packed kernels'
// (packed_micro.h: the same FMA chain per output as the `packed*` paths, so each product is bit-equal to the routed
// Linear's on the same weights). The rest rounds as any other CPU implementation may (a different summation order
// in the norms and the attention's sums): a head's output steers drafting only, never the target's output.
//
// Weights are packed for this build's vector width (V::NB output rows a block): fp32, or fp16 where the head's
// weights are fp16-exact (`half_drafter`). The cache: per layer, its key and value buffers [kv_heads, capacity, d]
// (GrowingLayer's, contiguous), `past` slots filled; this call writes slots [past, past + n) and attends over
// [0, past + n) with mask [n, past + n] (0 visible, dtype-min hidden).
#include "packed_micro.h"
#include <cmath>
#include <vector>

#ifdef __AVX512F__
using V = Avx512;
#else
using V = Avx2;
#endif

torch::Tensor pack(torch::Tensor w, bool half) { return half ? pack_blocks<V, at::Half>(w) : pack_blocks<V>(w); }

int64_t block_rows() { return V::NB; }

// x [M, K] . W^T on the packed W (fp32 or fp16 blocks)
static torch::Tensor product(const torch::Tensor& x, const torch::Tensor& p, int64_t pf) {
  return p.scalar_type() == at::kHalf ? micro_linear<V, at::Half>(x, p, pf) : micro_linear<V, float>(x, p, pf);
}

// y[r] = w * (x[r] * rsqrt(mean(x[r]^2) + eps)), as LlamaRMSNorm in fp32
static torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const int64_t n = x.size(0), h = x.size(1);
  auto y = torch::empty_like(x);
  const float* X = x.data_ptr<float>();
  const float* W = w.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = X + r * h;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < h; ++i) s += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(s / static_cast<float>(h) + static_cast<float>(eps));
    float* yr = Y + r * h;
#pragma omp simd
    for (int64_t i = 0; i < h; ++i) yr[i] = W[i] * (xr[i] * inv);
  }
  return y;
}

struct Shape {
  int64_t n, heads, kv_heads, d, past;
};

// One decoder layer on x [n, H] (in place): w = {input norm, q, k, v, o, post-attention norm, gate, up, down}.
static void layer(torch::Tensor& x, const std::vector<torch::Tensor>& w, const float* cos, const float* sin,
                  const torch::Tensor& kbuf, const torch::Tensor& vbuf, const float* mask, const Shape& s, double eps,
                  double scaling, int64_t pf) {
  const int64_t n = s.n, d = s.d, half = d / 2, L = s.past + n, group = s.heads / s.kv_heads;
  const int64_t cap = kbuf.size(1);
  auto h = rms_norm(x, w[0], eps);
  auto q = product(h, w[1], pf);  // [n, heads * d]
  auto k = product(h, w[2], pf);  // [n, kv_heads * d]
  auto v = product(h, w[3], pf);
  float* Q = q.data_ptr<float>();
  float* Kb = kbuf.data_ptr<float>();  // [kv_heads, cap, d]
  float* Vb = vbuf.data_ptr<float>();
  const float* Kn = k.data_ptr<float>();
  const float* Vn = v.data_ptr<float>();
  std::vector<float> tmp(d);
  auto rotate = [&](float* out, const float* in, const float* c, const float* sn) {  // in may alias out
    for (int64_t j = 0; j < half; ++j) {
      tmp[j] = in[j] * c[j] - in[j + half] * sn[j];
      tmp[j + half] = in[j + half] * c[j + half] + in[j] * sn[j + half];
    }
    std::copy(tmp.begin(), tmp.end(), out);
  };
  for (int64_t r = 0; r < n; ++r) {
    const float* c = cos + r * d;
    const float* sn = sin + r * d;
    for (int64_t a = 0; a < s.heads; ++a) rotate(Q + (r * s.heads + a) * d, Q + (r * s.heads + a) * d, c, sn);
    for (int64_t g = 0; g < s.kv_heads; ++g) {  // the cache's append: slot past + r of kv head g
      rotate(Kb + (g * cap + s.past + r) * d, Kn + (r * s.kv_heads + g) * d, c, sn);
      std::copy(Vn + (r * s.kv_heads + g) * d, Vn + (r * s.kv_heads + g + 1) * d, Vb + (g * cap + s.past + r) * d);
    }
  }
  // attention, the query heads that share a key/value head side by side: Qg [kv_heads, group * n, d], row j * n + r
  // holding row r's query head g * group + j (as treegraft/attention.py packs them), two batched products on the
  // cache's buffers as they are ([kv_heads, L, d] views) and a softmax over [kv_heads, group, n, L] + the mask
  auto qg = torch::empty({s.kv_heads, group * n, d}, x.options());
  float* QG = qg.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t a = 0; a < s.heads; ++a)
      std::copy(Q + (r * s.heads + a) * d, Q + (r * s.heads + a + 1) * d,
                QG + ((a / group) * group * n + (a % group) * n + r) * d);
  auto keys = kbuf.narrow(1, 0, L), values = vbuf.narrow(1, 0, L);  // [kv_heads, L, d]
  auto scores = at::bmm(qg, keys.transpose(1, 2)).mul_(scaling).view({s.kv_heads, group, n, L});  // [.., n, L]
  scores.add_(torch::from_blob(const_cast<float*>(mask), {n, L}, x.options()));
  auto probs = at::_softmax(scores, -1, false).view({s.kv_heads, group * n, L});
  auto og = at::bmm(probs, values);  // [kv_heads, group * n, d]
  auto o = torch::empty({n, s.heads * d}, x.options());  // [n, heads * d]
  const float* OG = og.data_ptr<float>();
  float* O = o.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t a = 0; a < s.heads; ++a)
      std::copy(OG + ((a / group) * group * n + (a % group) * n + r) * d,
                OG + ((a / group) * group * n + (a % group) * n + r + 1) * d, O + (r * s.heads + a) * d);
  x.add_(product(o, w[4], pf));
  h = rms_norm(x, w[5], eps);
  auto gate = product(h, w[6], pf);  // [n, I]
  auto up = product(h, w[7], pf);
  at::silu_(gate).mul_(up);
  x.add_(product(gate, w[8], pf));
}

// feats [n, H], ids [n] -> the head's output features [n, H]; layers: 9 packed/norm tensors per layer (see `layer`)
torch::Tensor head_forward(torch::Tensor feats, torch::Tensor ids, torch::Tensor embed, torch::Tensor fc,
                           torch::Tensor positions, torch::Tensor inv_freq, double rope_scale, torch::Tensor mask,
                           std::vector<torch::Tensor> layers, std::vector<torch::Tensor> kbufs,
                           std::vector<torch::Tensor> vbufs, int64_t past, torch::Tensor norm, double eps,
                           int64_t heads, int64_t kv_heads, double scaling, int64_t pf) {
  TORCH_CHECK(feats.dim() == 2 && feats.scalar_type() == at::kFloat && feats.is_contiguous(), "feats: fp32 [n, H]");
  TORCH_CHECK(embed.scalar_type() == at::kFloat && embed.is_contiguous(), "embeddings: fp32 [vocab, H]");
  ids = ids.contiguous(), positions = positions.contiguous(), inv_freq = inv_freq.contiguous();
  const int64_t n = feats.size(0), H = feats.size(1), d = inv_freq.size(0) * 2;
  for (size_t i = 0; i < layers.size(); i += 9)
    for (size_t j : {0, 5})
      TORCH_CHECK(layers[i + j].scalar_type() == at::kFloat && layers[i + j].is_contiguous() &&
                      layers[i + j].numel() == H, "norm weights: fp32 [H]");
  TORCH_CHECK(norm.scalar_type() == at::kFloat && norm.is_contiguous() && norm.numel() == H, "final norm: fp32 [H]");
  TORCH_CHECK(layers.size() == 9 * kbufs.size() && kbufs.size() == vbufs.size(), "9 tensors and 2 buffers per layer");
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == n && mask.size(1) == past + n && mask.is_contiguous(),
              "mask [n, past + n]");
  TORCH_CHECK(heads % kv_heads == 0 && ids.numel() == n && positions.numel() == n && embed.size(1) == H &&
                  ids.scalar_type() == at::kLong && positions.scalar_type() == at::kLong &&
                  mask.scalar_type() == at::kFloat && inv_freq.scalar_type() == at::kFloat,
              "shapes and dtypes");
  for (size_t i = 0; i < kbufs.size(); ++i)
    TORCH_CHECK(kbufs[i].is_contiguous() && vbufs[i].is_contiguous() && kbufs[i].dim() == 3 &&
                    kbufs[i].size(0) == kv_heads && kbufs[i].size(1) >= past + n && kbufs[i].size(2) == d &&
                    vbufs[i].sizes() == kbufs[i].sizes(),
                "cache buffers [kv_heads, capacity >= past + n, d]");
  // x = fc([feature; embedding])
  auto cat = torch::empty({n, 2 * H}, feats.options());
  const int64_t* I = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) TORCH_CHECK(I[r] >= 0 && I[r] < embed.size(0), "token id out of range");
  for (int64_t r = 0; r < n; ++r) {
    std::copy(feats.data_ptr<float>() + r * H, feats.data_ptr<float>() + (r + 1) * H, cat.data_ptr<float>() + r * 2 * H);
    std::copy(embed.data_ptr<float>() + I[r] * H, embed.data_ptr<float>() + (I[r] + 1) * H,
              cat.data_ptr<float>() + r * 2 * H + H);
  }
  auto x = product(cat, fc, pf);
  // the rotary table [n, d]: cos / sin of position * inv_freq, each half repeated, times the rope's scale
  std::vector<float> cos(n * d), sin(n * d);
  const int64_t* P = positions.data_ptr<int64_t>();
  const float* F = inv_freq.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d / 2; ++j) {
      const float angle = static_cast<float>(P[r]) * F[j];
      cos[r * d + j] = cos[r * d + j + d / 2] = std::cos(angle) * static_cast<float>(rope_scale);
      sin[r * d + j] = sin[r * d + j + d / 2] = std::sin(angle) * static_cast<float>(rope_scale);
    }
  const Shape s{n, heads, kv_heads, d, past};
  for (size_t l = 0; l < kbufs.size(); ++l) {
    std::vector<torch::Tensor> w(layers.begin() + 9 * l, layers.begin() + 9 * (l + 1));
    layer(x, w, cos.data(), sin.data(), kbufs[l], vbufs[l], mask.data_ptr<float>(), s, eps, scaling, pf);
  }
  return rms_norm(x, norm, eps);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "W [N, K] fp32 -> packed blocks [N / NB, K, NB] (fp16 with half)");
  m.def("block_rows", &block_rows, "output rows per packed block in this build (NB)");
  m.def("head_forward", &head_forward, "a Llama-class draft head's forward over a tree batch (see the source)");
}
