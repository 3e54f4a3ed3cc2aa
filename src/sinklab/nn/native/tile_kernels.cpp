// sinklab's fused tile kernels: the element-wise work of one attention tile (sinklab.nn.attention.tile_forward /
// tile_backward) as one loop over each row, bit for bit the arithmetic of the eager tile functions in
// sinklab/nn/ops.py at one thread.
//
// Why bit for bit: every step is the same IEEE float32 operation, in the same order, as the eager PyTorch pass
// it replaces (no FMA contraction: built with -ffp-contract=off); exp2, expm1 and exp are the Sleef u10 functions
// that PyTorch's own 8-wide (AVX2) CPU kernels call (exported by libtorch_cpu); each row sum is PyTorch's cascade
// sum (aten/src/ATen/native/cpu/SumKernel.cpp: 8-wide vectors, 4 partial sums, 4 levels) re-implemented here.
// Element-wise eager passes take a scalar path for the last numel % 16 (AVX2) or % 32 (AVX-512) elements of a
// tensor: the Python side (sinklab/nn/native/__init__.py, sinklab/nn/loss.py) calls these kernels only for tiles and
// chunks whose numel is a multiple of 32, where every element takes the vector path.
//
// Layout: s, dw (N, C, Tk) float32 contiguous; mask (C, Tk) or (N, C, Tk) bool; row statistics (N, C, 1). The logits
// s of an operation that masks by a -inf logit bias may come without it: the kernels read masked logits as -inf.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t W = 8;  // floats per vector (AVX2): the width PyTorch's sum and element-wise kernels use here

inline int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  return 64 - __builtin_clzll(static_cast<uint64_t>(x - 1));
}

struct F1 {  // scalar accumulator
  using T = float;
  static T zero() { return 0.0f; }
  static T add(T a, T b) { return a + b; }
  static T load(const float* p) { return *p; }
};
struct F8 {  // 8-wide accumulator
  using T = __m256;
  static T zero() { return _mm256_setzero_ps(); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
};

// SumKernel.cpp multi_row_sum with nrows = 4: element (i, k) at x + (i * 4 + k) * unit.
template <typename A>
void multi_row_sum4(const float* x, int64_t unit, int64_t size, typename A::T out[4]) {
  constexpr int64_t levels = 4;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(size) / levels);
  const int64_t level_step = int64_t(1) << level_power;
  const int64_t level_mask = level_step - 1;
  typename A::T acc[levels][4];
  for (int64_t l = 0; l < levels; ++l)
    for (int k = 0; k < 4; ++k) acc[l][k] = A::zero();
  int64_t i = 0;
  for (; i + level_step <= size;) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < 4; ++k) acc[0][k] = A::add(acc[0][k], A::load(x + (i * 4 + k) * unit));
    for (int64_t j = 1; j < levels; ++j) {
      for (int k = 0; k < 4; ++k) {
        acc[j][k] = A::add(acc[j][k], acc[j - 1][k]);
        acc[j - 1][k] = A::zero();
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < 4; ++k) acc[0][k] = A::add(acc[0][k], A::load(x + (i * 4 + k) * unit));
  for (int64_t j = 1; j < levels; ++j)
    for (int k = 0; k < 4; ++k) acc[0][k] = A::add(acc[0][k], acc[j][k]);
  for (int k = 0; k < 4; ++k) out[k] = acc[0][k];
}

// SumKernel.cpp row_sum: size units of `unit` floats, 4 partial sums.
template <typename A>
typename A::T row_sum(const float* x, int64_t unit, int64_t size) {
  typename A::T p[4];
  const int64_t size_ilp = size / 4;
  multi_row_sum4<A>(x, unit, size_ilp, p);
  for (int64_t i = size_ilp * 4; i < size; ++i) p[0] = A::add(p[0], A::load(x + i * unit));
  for (int k = 1; k < 4; ++k) p[0] = A::add(p[0], p[k]);
  return p[0];
}

// torch.sum(x, dim=-1) of one contiguous float32 row of n values (the output starts at 0 and is added to).
float torch_row_sum(const float* x, int64_t n) {
  float acc;
  if (n >= W) {  // vectorized_inner_sum
    const int64_t vec_size = n / W;
    __m256 v = row_sum<F8>(x, W, vec_size);
    acc = 0.0f;
    for (int64_t k = vec_size * W; k < n; ++k) acc += x[k];
    alignas(32) float part[W];
    _mm256_store_ps(part, v);
    for (int64_t k = 0; k < W; ++k) acc += part[k];
  } else {  // scalar_inner_sum
    acc = row_sum<F1>(x, 1, n);
  }
  return 0.0f + acc;
}

// ------------------------------------------------------------------ element-wise pieces (VW floats at a time)
// Built twice: with SINKLAB_AVX512 (16-wide, where PyTorch's CPU capability is AVX512) and without (8-wide AVX2).
// Element-wise IEEE operations give the same bits at any width, and the 16- and 8-wide Sleef functions used here
// give the same bits as each other and as PyTorch's (tests/test_native_tiles.py); only the row sums keep
// PyTorch's 8-wide order (torch_row_sum above).
#ifdef SINKLAB_AVX512
extern "C" __m512 Sleef_exp2f16_u10(__m512);
extern "C" __m512 Sleef_expm1f16_u10(__m512);
extern "C" __m512 Sleef_expf16_u10(__m512);
using V = __m512;
constexpr int64_t VW = 16;
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V v1(float a) { return _mm512_set1_ps(a); }
inline V vzero() { return _mm512_setzero_ps(); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
inline V vmin(V a, V b) { return _mm512_min_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vexp(V x) { return Sleef_expf16_u10(x); }
inline V vexp2(V x) { return Sleef_exp2f16_u10(x); }
inline V vexpm1(V x) { return Sleef_expm1f16_u10(x); }
inline V vabs(V x) { return _mm512_andnot_ps(v1(-0.0f), x); }
inline V vlt1(V a, V b) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), v1(1.0f)); }  // (a < b) 1/0
inline V vsel_gt(V x, V y, V a, V b) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, y, _CMP_GT_OQ), b, a); }  // x > y ? a : b
inline V vmask(const bool* m) {  // mask.to(float32): 1.0 / 0.0
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m))));
}
inline V vkeep(V x, const bool* m) {  // masked_fill(~mask, 0)
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(vmask(m), vzero(), _CMP_NEQ_OQ), x);
}
inline V vlogits(V x, const bool* m) {  // masked_fill(~mask, -inf): the logits of a mask_as_bias operation
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(vmask(m), vzero(), _CMP_NEQ_OQ), v1(-INFINITY), x);
}
#else
extern "C" __m256 Sleef_exp2f8_u10(__m256);
extern "C" __m256 Sleef_expm1f8_u10(__m256);
extern "C" __m256 Sleef_expf8_u10(__m256);
using V = __m256;
constexpr int64_t VW = 8;
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V v1(float a) { return _mm256_set1_ps(a); }
inline V vzero() { return _mm256_setzero_ps(); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
inline V vmin(V a, V b) { return _mm256_min_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V vexp(V x) { return Sleef_expf8_u10(x); }
inline V vexp2(V x) { return Sleef_exp2f8_u10(x); }
inline V vexpm1(V x) { return Sleef_expm1f8_u10(x); }
inline V vabs(V x) { return _mm256_andnot_ps(v1(-0.0f), x); }
inline V vlt1(V a, V b) { return _mm256_and_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ), v1(1.0f)); }
inline V vsel_gt(V x, V y, V a, V b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, y, _CMP_GT_OQ)); }
inline V vmask(const bool* m) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m))));
}
inline V vkeep(V x, const bool* m) { return _mm256_and_ps(x, _mm256_cmp_ps(vmask(m), vzero(), _CMP_NEQ_OQ)); }
inline V vlogits(V x, const bool* m) { return _mm256_blendv_ps(v1(-INFINITY), x, _mm256_cmp_ps(vmask(m), vzero(), _CMP_NEQ_OQ)); }
#endif

inline V relu8(V x) { return vmax(vzero(), x); }                                       // clamp_min(x, 0)
inline V sigmoid8(V x) { return vdiv(v1(1.0f), vadd(vexp(vsub(vzero(), x)), v1(1.0f))); }  // 1 / (exp(0 - x) + 1)
inline V elu8(V x) { return vsel_gt(x, vzero(), x, vexpm1(x)); }                        // x > 0 ? x : expm1(x)
inline V gt0(V x) { return vlt1(vzero(), x); }                                          // (x > 0) as 1.0 / 0.0
inline V sign8(V x) { return vsub(vlt1(vzero(), x), vlt1(x, vzero())); }               // (0 < x) - (x < 0)
inline float max_ss(float floor, float z) {  // clamp_min(z, floor) as PyTorch's vector max (z if NaN)
  return _mm_cvtss_f32(_mm_max_ss(_mm_set_ss(floor), _mm_set_ss(z)));
}

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN as 0xFFFF: PyTorch's vector conversion
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0xFFFF;
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// the forward's weights of one row: float32 into x, or (ob not null) bfloat16 into ob as PyTorch's .to(bfloat16)
inline void store_w(float* x, uint16_t* ob, int64_t j, V w) {
  if (!ob) {
    vstore(x + j, w);
    return;
  }
  alignas(64) float t[VW];
  vstore(t, w);
  for (int64_t k = 0; k < VW; ++k) ob[j + k] = f32_to_bf16(t[k]);
}

// the bfloat16 output of a forward kernel (s's shape, contiguous), or null for the weights in s as float32
inline uint16_t* bf16_out(const torch::Tensor& s, const c10::optional<torch::Tensor>& out) {
  if (!out) return nullptr;
  TORCH_CHECK(out->scalar_type() == torch::kBFloat16 && out->sizes() == s.sizes() && out->is_contiguous(),
              "out: bfloat16 like s");
  return reinterpret_cast<uint16_t*>(out->data_ptr<at::BFloat16>());
}

struct Rows {  // row r of an (N, C, Tk) tile and of its mask
  int64_t N, C, Tk;
  bool per_row_mask;
  const bool* mask;
  const bool* mask_row(int64_t r) const { return mask + (per_row_mask ? r : r % C) * Tk; }
};

Rows rows_of(const torch::Tensor& s, const torch::Tensor& mask) {
  TORCH_CHECK(s.dim() == 3 && s.scalar_type() == torch::kFloat32 && s.is_contiguous(), "s: (N, C, Tk) float32 contiguous");
  TORCH_CHECK(mask.scalar_type() == torch::kBool && mask.is_contiguous(), "mask: bool contiguous");
  TORCH_CHECK(s.size(2) % VW == 0 && s.numel() % 32 == 0, "Tk must be a multiple of the vector width and the tile's numel of 32");
  Rows R{s.size(0), s.size(1), s.size(2), mask.dim() == 3, mask.data_ptr<bool>()};
  TORCH_CHECK(mask.size(-1) == R.Tk && mask.size(-2) == R.C && (mask.dim() == 2 || mask.size(0) == R.N), "mask shape");
  return R;
}

// ------------------------------------------------------------------ element-wise families (sinklab.nn.ops._Elementwise)
// kind: 0 identity (linear-attention kernels: the logits are phi(q).phi(k)), 1 relu, 2 sigmoid(s + bias), 3 elu(s) + 1
// norm: 0 none, 1 sum (g / max(sum g, floor)), 2 pnorm with p = 2 (g / max(sqrt(sum g*g), floor))
struct Family {
  int64_t kind, norm;
  float bias, floor;
  bool mask_as_bias;
};

// g = sim(s) of one row, in place (eager: similarity_ then masked_fill_(~mask, 0) where the mask is not a bias).
void similarity_row(const Family& f, float* x, const bool* m, int64_t Tk) {
  for (int64_t j = 0; j < Tk; j += VW) {
    V v = f.mask_as_bias ? vlogits(vload(x + j), m + j) : vload(x + j);  // -inf where masked (already, or here)
    if (f.kind == 1) v = relu8(v);
    else if (f.kind == 2) {
      if (f.bias != 0.0f) v = vadd(v, v1(f.bias));
      v = sigmoid8(v);
    } else if (f.kind == 3) v = vadd(elu8(v), v1(1.0f));
    if (!f.mask_as_bias) v = vkeep(v, m + j);
    vstore(x + j, v);
  }
}

// d sim / d s from g = sim(s) (eager: similarity_grad)
inline V similarity_grad8(const Family& f, V g, const bool* m) {
  if (f.kind == 0) return vmask(m);
  if (f.kind == 1) return gt0(g);
  if (f.kind == 2) return vfma(vmul(v1(-1.0f), g), g, g);  // addcmul_(g, g, value=-1): one FMA
  return vmin(v1(1.0f), g);                                                            // clamp_(max=1)
}

// row normaliser of norm = 1: z = sum g (eager: g.sum()) into zc (clamped) and active (z >= floor)
void normaliser_row(const Family& f, const float* g, int64_t Tk, float& zc, float& active) {
  const float z = torch_row_sum(g, Tk);
  zc = max_ss(f.floor, z);
  active = (z >= f.floor) ? 1.0f : 0.0f;
}

// sum g*g of a row (eager: g.pow(2).sum(); the square root that follows is PyTorch's, on the Python side)
float square_sum_row(const float* g, float* tmp, int64_t Tk) {
  for (int64_t j = 0; j < Tk; j += VW) {
    V v = vload(g + j);
    vstore(tmp + j, vmul(v, v));
  }
  return torch_row_sum(tmp, Tk);
}

Family family(int64_t kind, int64_t norm, double bias, double floor, bool mask_as_bias) {
  TORCH_CHECK(kind >= 0 && kind <= 3 && norm >= 0 && norm <= 2, "unknown similarity or normaliser");
  return Family{kind, norm, static_cast<float>(bias), static_cast<float>(floor), mask_as_bias};
}

// forward: s -> weights in place; returns s
torch::Tensor elementwise_weights(torch::Tensor s, torch::Tensor mask, int64_t kind, int64_t norm, double bias,
                                  double floor, bool mask_as_bias, c10::optional<torch::Tensor> out) {
  const Family f = family(kind, norm, bias, floor, mask_as_bias);
  TORCH_CHECK(norm != 2, "norm 2: elementwise_square_sums, then the division");
  const Rows R = rows_of(s, mask);
  float* S = s.data_ptr<float>();
  uint16_t* OB = bf16_out(s, out);
  at::parallel_for(0, R.N * R.C, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* x = S + r * R.Tk;
      uint16_t* ob = OB ? OB + r * R.Tk : nullptr;
      similarity_row(f, x, R.mask_row(r), R.Tk);
      float zc = 1.0f, active;
      if (f.norm != 0) normaliser_row(f, x, R.Tk, zc, active);
      const V vz = v1(zc);
      if (f.norm == 0 && !ob) continue;
      for (int64_t j = 0; j < R.Tk; j += VW) store_w(x, ob, j, f.norm == 0 ? vload(x + j) : vdiv(vload(x + j), vz));
    }
  });
  return out ? *out : s;
}

// backward: s -> weights in place (for dV = W^T dO), dw -> dS in place
// norm 2: s holds g already (elementwise_square_sums) and zc, active (N, C, 1) come from PyTorch's square root.
void elementwise_backward(torch::Tensor s, torch::Tensor mask, torch::Tensor dw, int64_t kind, int64_t norm,
                          double bias, double floor, bool mask_as_bias, c10::optional<torch::Tensor> zc_t,
                          c10::optional<torch::Tensor> active_t) {
  const Family f = family(kind, norm, bias, floor, mask_as_bias);
  TORCH_CHECK(norm != 2 || (zc_t && active_t), "norm 2 needs zc and active");
  const float* ZC = norm == 2 ? zc_t->data_ptr<float>() : nullptr;
  const bool* ACT = norm == 2 ? active_t->data_ptr<bool>() : nullptr;
  const Rows R = rows_of(s, mask);
  TORCH_CHECK(dw.sizes() == s.sizes() && dw.is_contiguous() && dw.scalar_type() == torch::kFloat32, "dw like s");
  float* S = s.data_ptr<float>();
  float* D = dw.data_ptr<float>();
  at::parallel_for(0, R.N * R.C, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> tmp(R.Tk);
    for (int64_t r = r0; r < r1; ++r) {
      float* x = S + r * R.Tk;
      float* d = D + r * R.Tk;
      const bool* m = R.mask_row(r);
      if (f.norm != 2) similarity_row(f, x, m, R.Tk);
      if (f.norm == 0) {  // dS = dW * sim'(g)
        for (int64_t j = 0; j < R.Tk; j += VW) {
          V g = vload(x + j);
          vstore(d + j, vmul(vload(d + j), similarity_grad8(f, g, m + j)));
        }
        continue;
      }
      float zc, active;
      if (f.norm == 1) normaliser_row(f, x, R.Tk, zc, active);
      else {
        zc = ZC[r];
        active = ACT[r] ? 1.0f : 0.0f;
      }
      const V vz = v1(zc);
      for (int64_t j = 0; j < R.Tk; j += VW) {  // w = g / zc (kept in s), dW * w for r
        V w = vdiv(vload(x + j), vz);
        vstore(x + j, w);
        vstore(tmp.data() + j, vmul(vload(d + j), w));
      }
      const V vr = v1(torch_row_sum(tmp.data(), R.Tk) * active);  // r = sum dW w, 0 where the floor holds
      for (int64_t j = 0; j < R.Tk; j += VW) {
        V w = vload(x + j);
        V t = f.norm == 1 ? vsub(vload(d + j), vr) : vsub(vload(d + j), vmul(w, vr));  // dw - r | dw - w r
        t = vdiv(t, vz);
        V g = vmul(w, vz);  // w * zc
        vstore(d + j, vmul(t, similarity_grad8(f, g, m + j)));
      }
    }
  });
}

// norm 2, first half: g = sim(s) in place, returns sum g*g (N, C, 1)
torch::Tensor elementwise_square_sums(torch::Tensor s, torch::Tensor mask, int64_t kind, double bias, bool mask_as_bias) {
  const Family f = family(kind, 2, bias, 0.0, mask_as_bias);
  const Rows R = rows_of(s, mask);
  auto out = torch::empty({R.N, R.C, 1}, s.options());
  float* S = s.data_ptr<float>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, R.N * R.C, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> tmp(R.Tk);
    for (int64_t r = r0; r < r1; ++r) {
      float* x = S + r * R.Tk;
      similarity_row(f, x, R.mask_row(r), R.Tk);
      O[r] = square_sum_row(x, tmp.data(), R.Tk);
    }
  });
  return out;
}

// ------------------------------------------------------------------ softpick (sinklab.nn.ops.Softpick)
// m = max(0, max_j s_j), em = exp(-m), eps_em = 1e-6 * em: (N, C, 1), computed by PyTorch before the call.
// e = exp2((s - m) log2 e), d = e - em [visible], a = sum |d| + eps_em, w = relu(d) / a.
constexpr float LOG2E = 1.4426950408889634f;

// one row's e (optional), d and a = sum |d| + eps_em (tmp: scratch)
inline float softpick_row(const float* x, const bool* mk, float m, float em, float eps_em, float* e, float* d,
                          float* tmp, int64_t Tk) {
  const V vm = v1(m), vl = v1(LOG2E), vnem = vmul(v1(-1.0f), v1(em));
  for (int64_t j = 0; j < Tk; j += VW) {
    V ev = vexp2(vmul(vsub(vlogits(vload(x + j), mk + j), vm), vl));
    V dv = vadd(ev, vmul(vnem, vmask(mk + j)));  // addcmul(e, em, mask, value=-1)
    if (e) vstore(e + j, ev);
    vstore(d + j, dv);
    vstore(tmp + j, vabs(dv));
  }
  return torch_row_sum(tmp, Tk) + eps_em;
}

torch::Tensor softpick_weights(torch::Tensor s, torch::Tensor mask, torch::Tensor m, torch::Tensor em,
                               torch::Tensor eps_em, c10::optional<torch::Tensor> out) {
  const Rows R = rows_of(s, mask);
  float* S = s.data_ptr<float>();
  const float *M = m.data_ptr<float>(), *EM = em.data_ptr<float>(), *EE = eps_em.data_ptr<float>();
  uint16_t* OB = bf16_out(s, out);
  at::parallel_for(0, R.N * R.C, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> d(R.Tk), tmp(R.Tk);
    for (int64_t r = r0; r < r1; ++r) {
      float* x = S + r * R.Tk;
      const V va = v1(softpick_row(x, R.mask_row(r), M[r], EM[r], EE[r], nullptr, d.data(), tmp.data(), R.Tk));
      uint16_t* ob = OB ? OB + r * R.Tk : nullptr;
      for (int64_t j = 0; j < R.Tk; j += VW) store_w(x, ob, j, vdiv(relu8(vload(d.data() + j)), va));
    }
  });
  return out ? *out : s;
}

void softpick_backward(torch::Tensor s, torch::Tensor mask, torch::Tensor dw, torch::Tensor m, torch::Tensor em,
                       torch::Tensor eps_em) {
  const Rows R = rows_of(s, mask);
  TORCH_CHECK(dw.sizes() == s.sizes() && dw.is_contiguous() && dw.scalar_type() == torch::kFloat32, "dw like s");
  float* S = s.data_ptr<float>();
  float* D = dw.data_ptr<float>();
  const float *M = m.data_ptr<float>(), *EM = em.data_ptr<float>(), *EE = eps_em.data_ptr<float>();
  at::parallel_for(0, R.N * R.C, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(R.Tk), d(R.Tk), tmp(R.Tk);
    for (int64_t r = r0; r < r1; ++r) {
      float* x = S + r * R.Tk;
      float* g = D + r * R.Tk;
      const V va = v1(softpick_row(x, R.mask_row(r), M[r], EM[r], EE[r], e.data(), d.data(), tmp.data(), R.Tk));
      for (int64_t j = 0; j < R.Tk; j += VW) {  // w (kept in s), dW * w for r
        V w = vdiv(relu8(vload(d.data() + j)), va);
        vstore(x + j, w);
        vstore(tmp.data() + j, vmul(vload(g + j), w));
      }
      const V vr = v1(torch_row_sum(tmp.data(), R.Tk));
      for (int64_t j = 0; j < R.Tk; j += VW) {  // (dW relu(sign d) - r) * ((sign d * e) / a)
        V sg = sign8(vload(d.data() + j));
        V t = vsub(vmul(vload(g + j), relu8(sg)), vr);
        V q = vdiv(vmul(sg, vload(e.data() + j)), va);
        vstore(g + j, vmul(t, q));
      }
    }
  });
}

// ------------------------------------------------------------------ softmax_pnorm (sinklab.nn.ops.SoftmaxPNorm)
// m = max_j s_j, s2 = (s - m) log2 e, e = exp2(s2), e^p = exp2(s2 p), z = sum e^p; w = e / z^(1/p) with z^(1/p) from
// PyTorch (its pow), passed in as zp.
inline float row_max(const float* x, const bool* mk, int64_t Tk) {  // amax over the visible keys: the same at any order
  V acc = v1(-INFINITY);
  for (int64_t j = 0; j < Tk; j += VW) acc = vmax(acc, vlogits(vload(x + j), mk + j));
  alignas(64) float part[VW];
  vstore(part, acc);
  float m = part[0];
  for (int64_t k = 1; k < VW; ++k) m = part[k] > m ? part[k] : m;
  return m;
}

torch::Tensor pnorm_sums(torch::Tensor s, torch::Tensor mask, double p) {  // z (N, C, 1); s unchanged
  const Rows R = rows_of(s, mask);
  const int64_t rows = R.N * R.C, Tk = R.Tk;
  auto out = torch::empty({s.size(0), s.size(1), 1}, s.options());
  const float* S = s.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const float pf = static_cast<float>(p);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> ep(Tk);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = S + r * Tk;
      const bool* mk = R.mask_row(r);
      const V vm = v1(row_max(x, mk, Tk)), vl = v1(LOG2E), vp = v1(pf);
      for (int64_t j = 0; j < Tk; j += VW) {
        V s2 = vmul(vsub(vlogits(vload(x + j), mk + j), vm), vl);
        vstore(ep.data() + j, vexp2(pf == 1.0f ? s2 : vmul(s2, vp)));
      }
      O[r] = torch_row_sum(ep.data(), Tk);
    }
  });
  return out;
}

// w = e / zp into s (or bf16 into out); with dw also dS = dw w - (e^p / z) r, r = sum dw w, into dw. z and zp
// (N, C, 1) come from pnorm_sums and PyTorch's pow; or, where PyTorch's z^(1/p) is exact (p = 1: z; p = 1/2, zsq:
// z * z), both are computed in the row (z_t and zp_t undefined): one pass.
void pnorm_apply(torch::Tensor s, torch::Tensor mask, c10::optional<torch::Tensor> dw_t, c10::optional<torch::Tensor> z_t,
                 c10::optional<torch::Tensor> zp_t, double p, bool zsq, c10::optional<torch::Tensor> out) {
  const Rows R = rows_of(s, mask);
  const int64_t rows = R.N * R.C, Tk = R.Tk;
  TORCH_CHECK(z_t.has_value() == zp_t.has_value() && (z_t || p == 1.0 || (p == 0.5 && zsq)), "z and zp, or p 1 or 1/2");
  float* S = s.data_ptr<float>();
  float* D = dw_t ? dw_t->data_ptr<float>() : nullptr;
  if (dw_t) TORCH_CHECK(dw_t->sizes() == s.sizes() && dw_t->is_contiguous(), "dw like s");
  const float* Z = z_t ? z_t->data_ptr<float>() : nullptr;
  const float* ZP = zp_t ? zp_t->data_ptr<float>() : nullptr;
  const float pf = static_cast<float>(p);
  uint16_t* OB = dw_t ? nullptr : bf16_out(s, out);
  const bool need_ep = D || !Z;
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> ep(Tk), e(Tk), tmp(Tk);
    for (int64_t r = r0; r < r1; ++r) {
      float* x = S + r * Tk;
      const bool* mk = R.mask_row(r);
      const V vm = v1(row_max(x, mk, Tk)), vl = v1(LOG2E), vp = v1(pf);
      for (int64_t j = 0; j < Tk; j += VW) {
        V s2 = vmul(vsub(vlogits(vload(x + j), mk + j), vm), vl);
        V ev = vexp2(s2);
        vstore(e.data() + j, ev);
        if (need_ep) vstore(ep.data() + j, pf == 1.0f ? ev : vexp2(vmul(s2, vp)));
      }
      const float z = Z ? Z[r] : torch_row_sum(ep.data(), Tk);
      const V vzp = v1(ZP ? ZP[r] : (zsq ? z * z : z)), vz = v1(z);
      uint16_t* ob = OB ? OB + r * Tk : nullptr;
      for (int64_t j = 0; j < Tk; j += VW) {
        V w = vdiv(vload(e.data() + j), vzp);
        store_w(x, ob, j, w);
        if (D) vstore(tmp.data() + j, vmul(vload(D + r * Tk + j), w));
      }
      if (!D) continue;
      float* d = D + r * Tk;
      const V vr = v1(torch_row_sum(tmp.data(), Tk));
      for (int64_t j = 0; j < Tk; j += VW)
        vstore(d + j, vsub(vload(tmp.data() + j), vmul(vdiv(vload(ep.data() + j), vz), vr)));
    }
  });
}

torch::Tensor masked_row_max(torch::Tensor s, torch::Tensor mask) {  // amax of the visible logits, (N, C, 1)
  const Rows R = rows_of(s, mask);
  auto out = torch::empty({R.N, R.C, 1}, s.options());
  const float* S = s.data_ptr<float>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, R.N * R.C, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) O[r] = row_max(S + r * R.Tk, R.mask_row(r), R.Tk);
  });
  return out;
}

// ------------------------------------------------------------------ chunked cross-entropy (sinklab.nn.loss)
// One chunk of sinklab.nn.loss._LinearCrossEntropy: rows of logits z (n, V), float32 or bfloat16 (read exactly as
// float32). ce_exp: m = max z, e = exp2((z - m) log2 e) into the float32 buffer e, s = sum e; returns (m, s) (n, 1).
// ce_grad: p = e * ws (ws = w / s from PyTorch), p[y] -= w, into out (float32 in place, or bfloat16 rounded to
// nearest even as PyTorch's copy_). grad_add: acc += float(x) of a bfloat16 x.
std::vector<torch::Tensor> ce_exp(torch::Tensor z, torch::Tensor e) {
  TORCH_CHECK(z.dim() == 2 && z.is_contiguous() && (z.scalar_type() == torch::kFloat32 || z.scalar_type() == torch::kBFloat16), "z");
  TORCH_CHECK(e.sizes() == z.sizes() && e.is_contiguous() && e.scalar_type() == torch::kFloat32, "e: float32 like z");
  const int64_t n = z.size(0), nv = z.size(1);
  TORCH_CHECK(nv % VW == 0, "the vocabulary must be a multiple of the vector width");
  auto m = torch::empty({n, 1}, e.options()), s = torch::empty({n, 1}, e.options());
  const bool bf = z.scalar_type() == torch::kBFloat16;
  const uint16_t* ZB = bf ? reinterpret_cast<const uint16_t*>(z.data_ptr<at::BFloat16>()) : nullptr;
  const float* ZF = bf ? nullptr : z.data_ptr<float>();
  float* E = e.data_ptr<float>();
  float *M = m.data_ptr<float>(), *S = s.data_ptr<float>();
  at::parallel_for(0, n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* er = E + r * nv;
      if (bf) for (int64_t j = 0; j < nv; ++j) er[j] = bf16_to_f32(ZB[r * nv + j]);
      else if (er != ZF + r * nv) std::memcpy(er, ZF + r * nv, nv * 4);
      V acc = v1(-INFINITY);
      for (int64_t j = 0; j < nv; j += VW) acc = vmax(acc, vload(er + j));
      alignas(64) float part[VW];
      vstore(part, acc);
      float mx = part[0];
      for (int64_t k = 1; k < VW; ++k) mx = part[k] > mx ? part[k] : mx;
      const V vm = v1(mx), vl = v1(LOG2E);
      for (int64_t j = 0; j < nv; j += VW) vstore(er + j, vexp2(vmul(vsub(vload(er + j), vm), vl)));
      M[r] = mx;
      S[r] = torch_row_sum(er, nv);
    }
  });
  return {m, s};
}

void ce_grad(torch::Tensor e, torch::Tensor ws, torch::Tensor w, torch::Tensor y, torch::Tensor out) {
  const int64_t n = e.size(0), nv = e.size(1);
  TORCH_CHECK(e.scalar_type() == torch::kFloat32 && e.is_contiguous() && out.sizes() == e.sizes() && out.is_contiguous(), "e, out");
  TORCH_CHECK(y.scalar_type() == torch::kInt64 && y.numel() == n && ws.numel() == n && w.numel() == n, "ws, w, y: (n,)");
  const bool bf = out.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(bf || out.scalar_type() == torch::kFloat32, "out: float32 or bfloat16");
  float* E = e.data_ptr<float>();
  const float *WS = ws.data_ptr<float>(), *Wt = w.data_ptr<float>();
  const int64_t* Y = y.data_ptr<int64_t>();
  uint16_t* OB = bf ? reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) : nullptr;
  float* OF = bf ? nullptr : out.data_ptr<float>();
  at::parallel_for(0, n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* er = E + r * nv;
      const V vws = v1(WS[r]);
      for (int64_t j = 0; j < nv; j += VW) vstore(er + j, vmul(vload(er + j), vws));  // p = e * (w / s)
      er[Y[r]] = er[Y[r]] - Wt[r];                                                     // p[y] -= w
      if (bf) for (int64_t j = 0; j < nv; ++j) OB[r * nv + j] = f32_to_bf16(er[j]);
      else if (OF + r * nv != er) std::memcpy(OF + r * nv, er, nv * 4);
    }
  });
}

void grad_add(torch::Tensor acc, torch::Tensor x) {  // acc (float32) += x (bfloat16), element-wise
  TORCH_CHECK(acc.scalar_type() == torch::kFloat32 && x.scalar_type() == torch::kBFloat16 && acc.sizes() == x.sizes() &&
              acc.is_contiguous() && x.is_contiguous(), "acc float32, x bfloat16, same shape, contiguous");
  float* A = acc.data_ptr<float>();
  const uint16_t* X = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  at::parallel_for(0, acc.numel(), 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) A[i] = A[i] + bf16_to_f32(X[i]);
  });
}

torch::Tensor row_sum_test(torch::Tensor x) {  // torch.sum(x, -1, keepdim=True) of an (R, n) tensor, re-implemented
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: (R, n) float32");
  auto out = torch::empty({x.size(0), 1}, x.options());
  for (int64_t r = 0; r < x.size(0); ++r) out.data_ptr<float>()[r] = torch_row_sum(x.data_ptr<float>() + r * x.size(1), x.size(1));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.attr("vector_width") = VW;
  mod.def("elementwise_weights", &elementwise_weights);
  mod.def("elementwise_backward", &elementwise_backward);
  mod.def("elementwise_square_sums", &elementwise_square_sums);
  mod.def("softpick_weights", &softpick_weights);
  mod.def("softpick_backward", &softpick_backward);
  mod.def("row_sum", &row_sum_test);
  mod.def("pnorm_sums", &pnorm_sums);
  mod.def("pnorm_apply", &pnorm_apply);
  mod.def("masked_row_max", &masked_row_max);
  mod.def("ce_exp", &ce_exp);
  mod.def("ce_grad", &ce_grad);
  mod.def("grad_add", &grad_add);
}
