// Fused 8-bit AdamW for one fp32 tensor on the CPU, as an XLA FFI custom call.
//
// One pass per block of `block_size` elements: the block's scale bounds from max|g| and the
// codes' maxima (kernel._scale_bounds), then clip, Adam, decoupled weight decay, the fp32 master
// update, the streaming copy (bf16 or fp32) and the requantized dynamic8 codes. The block stays in L1, so
// memory sees each byte once: read p g mc vc, write p copy mc vc (18 B/param). A second entry
// point writes only the codes and scales (read g mc vc, write mc vc: 8 B/param) for the optax
// transform, whose update XLA computes inside apply_updates. Blocks are split across threads.
// Same math as lazytrain_jax/optim/kernel.py (dynamic8); see ../native.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sched.h>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr float kMinScale = 7.888609052210118e-31f;  // 2**-100
constexpr float kInvM2 = static_cast<float>(1.0 / (127.0 * 127.0));
constexpr float kInvV2 = static_cast<float>(1.0 / (255.0 * 255.0));
constexpr float kMidM = static_cast<float>(2.0 * 127.0 * 127.0);
constexpr float kMidV = static_cast<float>(2.0 * 255.0 * 255.0 * 255.0 * 255.0);

struct Scalars {
  float clip, apply, b1, b2, eps, lr, wd, inv_bc1, inv_bc2;  // 1 / bias corrections
  float rsqrt_bc2 = 0.0f;  // sqrt(inv_bc2), set by Run
};

inline uint16_t to_bf16(float x) {  // round to nearest even; NaN stays a (quiet) NaN
  const uint32_t bits = __builtin_bit_cast(uint32_t, x);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>(x != x ? nan : rounded);
}

// The streaming copy of the new master: bf16 (rounded to nearest even) or fp32 (the value itself).
inline void store_copy(uint16_t* d, float x) { *d = to_bf16(x); }
inline void store_copy(float* d, float x) { *d = x; }

// The gradient as read by the host step: fp32, or bf16 (its bits the top half of an fp32: exact).
inline float load_grad(float x) { return x; }
inline float load_grad(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

constexpr int64_t kChunk = 256;  // elements per pass of a block's two loops (L1-resident temporaries)

// The dynamic8 codes of n elements from m, um = |m| / scale_m, uv = v / scale_v and y ~ sqrt(uv).
// m code: the t in 0..127 nearest to 127 sqrt(um) in the squared domain, signed like m; v code:
// nearest to 255 uv^(1/4) in the 4th-power domain. An estimate t = floor(127 sqrt(um)) only has to
// land on the pair {t, t + 1} (or one below it near an integer) that the exact midpoint test below
// decides between, so with AVX-512 the estimate's root is a 14-bit reciprocal square root
// (~0.01 code units off at most) instead of a full-precision one: bit-identical codes (tested
// against the scalar loop), two fewer divider-unit operations per element.
inline void encode_codes_scalar(int64_t lo, int64_t n, const float* m_a, const float* um_a,
                                const float* uv_a, const float* y_a, int8_t* mb, uint8_t* vb) {
  for (int64_t j = lo; j < n; ++j) {
    const float um = um_a[j];
    float t = std::min(std::floor(127.0f * std::sqrt(um)), 126.0f);
    float t1 = t + 1.0f;
    float code = um * kMidM > t * t1 * 2.0f + 1.0f ? t1 : t;
    mb[j] = static_cast<int8_t>(std::copysign(code, m_a[j]));  // -0 and +0 both give code 0
    t = std::min(std::floor(255.0f * std::sqrt(y_a[j])), 254.0f);
    t1 = t + 1.0f;
    const float t2 = t * t, t12 = t1 * t1;
    vb[j] = static_cast<uint8_t>(uv_a[j] * kMidV > t2 * t2 + t12 * t12 ? t1 : t);
  }
}

#if defined(__AVX512F__)
inline __m512 root_estimate(__m512 x) {  // sqrt(x) to ~2^-14; 0 where x is 0 (or NaN)
  const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
  return _mm512_maskz_mul_ps(pos, x, _mm512_rsqrt14_ps(x));
}

inline void encode_codes(int64_t n, const float* m_a, const float* um_a, const float* uv_a,
                         const float* y_a, int8_t* mb, uint8_t* vb) {
  const __m512 c127 = _mm512_set1_ps(127.0f), c126 = _mm512_set1_ps(126.0f);
  const __m512 c255 = _mm512_set1_ps(255.0f), c254 = _mm512_set1_ps(254.0f);
  const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
  const __m512 mid_m = _mm512_set1_ps(kMidM), mid_v = _mm512_set1_ps(kMidV);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  constexpr int kFloor = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    // m: min(NaN-free estimate, 126) like the scalar std::min (an inf um gives NaN here, then 126)
    const __m512 um = _mm512_load_ps(um_a + j);
    __m512 t = _mm512_min_ps(_mm512_roundscale_ps(_mm512_mul_ps(c127, root_estimate(um)), kFloor), c126);
    __m512 t1 = _mm512_add_ps(t, one);
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_mul_ps(um, mid_m),
                                      _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(t, t1), two), one),
                                      _CMP_GT_OQ);
    __m512 code = _mm512_mask_blend_ps(up, t, t1);
    const __m512i m_sign = _mm512_and_si512(_mm512_castps_si512(_mm512_load_ps(m_a + j)), sign);
    code = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(code), m_sign));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(mb + j),
                     _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(code)));
    // v
    t = _mm512_min_ps(_mm512_roundscale_ps(_mm512_mul_ps(c255, root_estimate(_mm512_load_ps(y_a + j))),
                                           kFloor), c254);
    t1 = _mm512_add_ps(t, one);
    const __m512 t2 = _mm512_mul_ps(t, t), t12 = _mm512_mul_ps(t1, t1);
    up = _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_load_ps(uv_a + j), mid_v),
                            _mm512_add_ps(_mm512_mul_ps(t2, t2), _mm512_mul_ps(t12, t12)), _CMP_GT_OQ);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(vb + j),
                     _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(_mm512_mask_blend_ps(up, t, t1))));
  }
  encode_codes_scalar(j, n, m_a, um_a, uv_a, y_a, mb, vb);
}
#else
inline void encode_codes(int64_t n, const float* m_a, const float* um_a, const float* uv_a,
                         const float* y_a, int8_t* mb, uint8_t* vb) {
  encode_codes_scalar(0, n, m_a, um_a, uv_a, y_a, mb, vb);
}
#endif

// Compile-time flags (a runtime one keeps the loop from vectorizing): kDecay, weight decay on
// this tensor; kMode, what the step writes besides the codes and scales: kMaster, the host step
// (p updated in place, the copy written, bf16 or fp32; `out` is the copy); kState, the codes and scales only
// (p and `out` unused: the optax transform's update u is computed by XLA, which fuses it into
// apply_updates; a u written here would be a fresh temporary, page-faulted every step).
enum Mode { kMaster = 0, kState = 1 };

template <bool kDecay, int kMode, typename GradT, typename CopyT>
void run_blocks(int64_t b0, int64_t b1_end, int64_t bs, const Scalars s,
                const GradT* __restrict__ g, float* __restrict__ p, CopyT* __restrict__ out,
                int8_t* __restrict__ mc, uint8_t* __restrict__ vc, float* __restrict__ ms,
                float* __restrict__ vs) {
  const float om1 = 1.0f - s.b1, om2 = 1.0f - s.b2;
  for (int64_t blk = b0; blk < b1_end; ++blk) {
    const int64_t o = blk * bs;
    const GradT* __restrict__ gb = g + o;
    // (kState passes no p and no out: no pointer arithmetic on them)
    float* __restrict__ pb = kMode == kMaster ? p + o : nullptr;
    CopyT* __restrict__ cb = kMode == kMaster ? out + o : nullptr;
    int8_t* __restrict__ mb = mc + o;
    uint8_t* __restrict__ vb = vc + o;
    if (s.apply == 0.0f) {  // skipped step: codes and scales kept; the host step writes the copy
      if constexpr (kMode == kMaster) {
        for (int64_t i = 0; i < bs; ++i) store_copy(cb + i, pb[i]);
      }
      continue;
    }
    float gmax = 0.0f;
    int mmax = 0, vmax = 0;
#pragma omp simd reduction(max : gmax, mmax, vmax)
    for (int64_t i = 0; i < bs; ++i) {
      gmax = std::max(gmax, std::fabs(load_grad(gb[i])));
      int c = mb[i];
      mmax = std::max(mmax, c < 0 ? -c : c);
      vmax = std::max(vmax, static_cast<int>(vb[i]));
    }
    const float sm_old = ms[blk], sv_old = vs[blk];
    const float g_max = gmax * s.clip;
    const float km = static_cast<float>(mmax), kv = static_cast<float>(vmax);
    const float m_max = sm_old * ((km * km) * kInvM2);
    const float qv = (kv * kv) * kInvV2;
    const float v_max = sv_old * (qv * qv);
    float sm = s.b1 * m_max + om1 * g_max;
    float sv = s.b2 * v_max + om2 * (g_max * g_max);
    sm = sm < kMinScale ? 0.0f : sm;
    sv = sv < kMinScale ? 0.0f : sv;
    const float inv_m = sm > 0.0f ? (64.0f / sm) * (1.0f / 64.0f) : 0.0f;
    const float inv_v = sv > 0.0f ? (64.0f / sv) * (1.0f / 64.0f) : 0.0f;
    const float rinv_v = sv > 0.0f ? 1.0f / std::sqrt(sv) : 0.0f;  // sqrt(uv) ~ sqrt(v) * this
    // In chunks that stay in L1: the Adam step (vectorized by the compiler), then the codes
    // (encode_codes: square-root estimates, corrected by an exact midpoint test).
    for (int64_t c0 = 0; c0 < bs; c0 += kChunk) {
      const int64_t n = std::min<int64_t>(kChunk, bs - c0);
      alignas(64) float m_a[kChunk], um_a[kChunk], uv_a[kChunk], y_a[kChunk];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const int64_t i = c0 + j;
        const float k = static_cast<float>(vb[i]);
        const float q = (k * k) * kInvV2;
        const float v_old = sv_old * (q * q);
        const float c = static_cast<float>(mb[i]);
        const float m_old = v_old == 0.0f ? 0.0f : sm_old * ((c * std::fabs(c)) * kInvM2);
        const float gg = load_grad(gb[i]) * s.clip;
        const float m = om1 * gg + s.b1 * m_old;
        const float v = om2 * (gg * gg) + s.b2 * v_old;
        const float rv = std::sqrt(v);  // shared by the update and the v code's estimate
        if constexpr (kMode == kMaster) {
          float u = (m * s.inv_bc1) / (rv * s.rsqrt_bc2 + s.eps);
          if constexpr (kDecay) u = u + s.wd * pb[i];
          u = -s.lr * u;
          const float np = pb[i] + u;
          pb[i] = np;
          store_copy(cb + i, np);
        }
        // um, uv: the moments over their block scales, exactly as XLA's (x / 64) * (64 / s)
        // (a power-of-two factor moves no rounding)
        m_a[j] = m;
        um_a[j] = std::fabs(m) * inv_m;
        uv_a[j] = v * inv_v;
        y_a[j] = rv * rinv_v;  // sqrt(uv), near enough for the v code's estimate
      }
      encode_codes(n, m_a, um_a, uv_a, y_a, mb + c0, vb + c0);
    }
    ms[blk] = sm;
    vs[blk] = sv;
  }
}

int num_threads(int64_t asked) {
  if (asked > 0) return static_cast<int>(asked);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

Scalars ReadScalars(ffi::Buffer<ffi::F32> scalars) {  // the 9 step scalars (native._scalars)
  const float* sc = scalars.typed_data();
  Scalars s{sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7], sc[8]};
  s.rsqrt_bc2 = std::sqrt(s.inv_bc2);
  return s;
}

// work(edge(i), edge(i + 1)) for i in 0..t-1, on t threads (this one takes i = 0).
template <typename Edge, typename Work>
void SplitAcrossThreads(int t, Edge edge, Work work) {
  if (t <= 1) {
    work(edge(0), edge(1));
    return;
  }
  std::vector<std::thread> pool;
  for (int i = 1; i < t; ++i) pool.emplace_back(work, edge(i), edge(i + 1));
  work(edge(0), edge(1));
  for (auto& th : pool) th.join();
}

template <int kMode, typename GradT, typename CopyT>
ffi::Error Run(int64_t n, int64_t block_size, bool decay, int64_t threads,
               ffi::Buffer<ffi::F32> scalars, const GradT* g, float* p, CopyT* out, int8_t* mc,
               uint8_t* vc, float* ms, float* vs) {
  const Scalars s = ReadScalars(scalars);
  const int64_t nb = n / block_size;
  const int t = static_cast<int>(
      std::min<int64_t>(num_threads(threads), std::max<int64_t>(1, nb / 64)));
  auto* fn = decay ? &run_blocks<true, kMode, GradT, CopyT> : &run_blocks<false, kMode, GradT, CopyT>;
  SplitAcrossThreads(t, [&](int i) { return nb * i / t; }, [&](int64_t lo, int64_t hi) {
    fn(lo, hi, block_size, s, g, p, out, mc, vc, ms, vs);
  });
  return ffi::Error::Success();
}

// f(typed pointer to the copy's data), the copy being bf16 (uint16_t) or f32 (float) of n
// elements; InvalidArgument naming `what` otherwise.
template <typename F>
ffi::Error WithCopy(ffi::Result<ffi::AnyBuffer>& copy, int64_t n, const char* what, F f) {
  if (copy->element_count() != static_cast<size_t>(n))
    return ffi::Error::InvalidArgument(std::string(what) + ": the copy's size differs");
  if (copy->element_type() == ffi::DataType::BF16) return f(static_cast<uint16_t*>(copy->untyped_data()));
  if (copy->element_type() == ffi::DataType::F32) return f(static_cast<float*>(copy->untyped_data()));
  return ffi::Error::InvalidArgument(std::string(what) + ": the copy must be bf16 or f32");
}

// f(typed pointer to the gradient's data), the gradient being bf16 (uint16_t) or f32 (float);
// InvalidArgument naming `what` otherwise.
template <typename F>
ffi::Error WithGrad(ffi::AnyBuffer g, const char* what, F f) {
  if (g.element_type() == ffi::DataType::BF16) return f(static_cast<const uint16_t*>(g.untyped_data()));
  if (g.element_type() == ffi::DataType::F32) return f(static_cast<const float*>(g.untyped_data()));
  return ffi::Error::InvalidArgument(std::string(what) + ": the gradient must be bf16 or f32");
}

ffi::Error CheckShapes(int64_t n, int64_t block_size, int64_t num_scales, int64_t num_scalars) {
  if (block_size <= 0 || n % block_size != 0)
    return ffi::Error::InvalidArgument("adam8bit: size must be a multiple of block_size");
  if (num_scales != n / block_size) return ffi::Error::InvalidArgument("adam8bit: scale shape");
  if (num_scalars != 9) return ffi::Error::InvalidArgument("adam8bit: 9 scalars expected");
  return ffi::Error::Success();
}

template <typename T>
void CopyIfNotAliased(T* dst, const T* src, int64_t count) {  // XLA could not alias a donation
  if (dst != src) std::memcpy(dst, src, count * sizeof(T));
}

// The host step: p, codes and scales updated in place (aliased), the copy (bf16 or fp32) of the new p.
ffi::Error Adam8bitImpl(ffi::Buffer<ffi::F32> p_in, ffi::AnyBuffer g,
                        ffi::Buffer<ffi::S8> mc_in, ffi::Buffer<ffi::U8> vc_in,
                        ffi::Buffer<ffi::F32> ms_in, ffi::Buffer<ffi::F32> vs_in,
                        ffi::Buffer<ffi::F32> scalars, ffi::ResultBuffer<ffi::F32> p,
                        ffi::Result<ffi::AnyBuffer> copy, ffi::ResultBuffer<ffi::S8> mc,
                        ffi::ResultBuffer<ffi::U8> vc, ffi::ResultBuffer<ffi::F32> ms,
                        ffi::ResultBuffer<ffi::F32> vs, int64_t block_size, bool decay,
                        int64_t threads) {
  const int64_t n = g.element_count(), nb = ms_in.element_count();
  ffi::Error err = CheckShapes(n, block_size, nb, scalars.element_count());
  if (err.failure()) return err;
  CopyIfNotAliased(p->typed_data(), p_in.typed_data(), n);
  CopyIfNotAliased(mc->typed_data(), mc_in.typed_data(), n);
  CopyIfNotAliased(vc->typed_data(), vc_in.typed_data(), n);
  CopyIfNotAliased(ms->typed_data(), ms_in.typed_data(), nb);
  CopyIfNotAliased(vs->typed_data(), vs_in.typed_data(), nb);
  return WithCopy(copy, n, "adam8bit", [&](auto* out) {
    return WithGrad(g, "adam8bit", [&](auto* gp) {
      return Run<kMaster>(n, block_size, decay, threads, scalars, gp, p->typed_data(), out,
                          mc->typed_data(), vc->typed_data(), ms->typed_data(), vs->typed_data());
    });
  });
}

// The same, writing the copy into the buffer of the previous one (aliased to `copy`, its contents
// unread): no fresh copy buffer per step, so none of the page faults of newly mapped memory.
ffi::Error Adam8bitIntoImpl(ffi::Buffer<ffi::F32> p_in, ffi::AnyBuffer g,
                            ffi::Buffer<ffi::S8> mc_in, ffi::Buffer<ffi::U8> vc_in,
                            ffi::Buffer<ffi::F32> ms_in, ffi::Buffer<ffi::F32> vs_in,
                            ffi::Buffer<ffi::F32> scalars, ffi::AnyBuffer copy_in,
                            ffi::ResultBuffer<ffi::F32> p, ffi::Result<ffi::AnyBuffer> copy,
                            ffi::ResultBuffer<ffi::S8> mc, ffi::ResultBuffer<ffi::U8> vc,
                            ffi::ResultBuffer<ffi::F32> ms, ffi::ResultBuffer<ffi::F32> vs,
                            int64_t block_size, bool decay, int64_t threads) {
  if (copy_in.element_count() != g.element_count() || copy_in.element_type() != copy->element_type())
    return ffi::Error::InvalidArgument("adam8bit: the previous copy's size or type differs");
  return Adam8bitImpl(p_in, g, mc_in, vc_in, ms_in, vs_in, scalars, p, copy, mc, vc, ms, vs,
                      block_size, decay, threads);
}

// The codes and scales only (aliased, in place): the optax transform's update u is XLA's.
ffi::Error Adam8bitStateImpl(ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::S8> mc_in,
                             ffi::Buffer<ffi::U8> vc_in, ffi::Buffer<ffi::F32> ms_in,
                             ffi::Buffer<ffi::F32> vs_in, ffi::Buffer<ffi::F32> scalars,
                             ffi::ResultBuffer<ffi::S8> mc, ffi::ResultBuffer<ffi::U8> vc,
                             ffi::ResultBuffer<ffi::F32> ms, ffi::ResultBuffer<ffi::F32> vs,
                             int64_t block_size, int64_t threads) {
  const int64_t n = g.element_count(), nb = ms_in.element_count();
  ffi::Error err = CheckShapes(n, block_size, nb, scalars.element_count());
  if (err.failure()) return err;
  CopyIfNotAliased(mc->typed_data(), mc_in.typed_data(), n);
  CopyIfNotAliased(vc->typed_data(), vc_in.typed_data(), n);
  CopyIfNotAliased(ms->typed_data(), ms_in.typed_data(), nb);
  CopyIfNotAliased(vs->typed_data(), vs_in.typed_data(), nb);
  return Run<kState, float, uint16_t>(n, block_size, false, threads, scalars, g.typed_data(), nullptr,
                               static_cast<uint16_t*>(nullptr),
                     mc->typed_data(), vc->typed_data(), ms->typed_data(), vs->typed_data());
}

// fp32 moments (the state ``fp32_state_filter`` keeps in fp32: embeddings, norms, biases by
// default): AdamW elementwise, the master in place, its copy (bf16 or fp32), m and v in place. One pass:
// read p g m v, write p copy m v (30 B/param); XLA's path takes several (kernel.leaf_update).
template <bool kDecay, typename GradT, typename CopyT>
void run_fp32(int64_t lo, int64_t hi, const Scalars s, const GradT* __restrict__ g,
              float* __restrict__ p, CopyT* __restrict__ cb, float* __restrict__ m,
              float* __restrict__ v) {
  if (s.apply == 0.0f) {  // skipped step: moments kept, the copy written
    for (int64_t i = lo; i < hi; ++i) store_copy(cb + i, p[i]);
    return;
  }
  const float om1 = 1.0f - s.b1, om2 = 1.0f - s.b2;
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const float gg = load_grad(g[i]) * s.clip;
    const float mi = om1 * gg + s.b1 * m[i];
    const float vi = om2 * (gg * gg) + s.b2 * v[i];
    float u = (mi * s.inv_bc1) / (std::sqrt(vi * s.inv_bc2) + s.eps);
    if constexpr (kDecay) u = u + s.wd * p[i];
    const float np = p[i] + -s.lr * u;
    p[i] = np;
    store_copy(cb + i, np);
    m[i] = mi;
    v[i] = vi;
  }
}

template <typename GradT, typename CopyT>
ffi::Error RunFp32(int64_t n, bool decay, int64_t threads, ffi::Buffer<ffi::F32> scalars,
                   const GradT* g, float* p, CopyT* copy, float* m, float* v) {
  const Scalars s = ReadScalars(scalars);
  constexpr int64_t kGrain = 1 << 14;  // elements a thread takes at least
  const int t = static_cast<int>(std::min<int64_t>(num_threads(threads), std::max<int64_t>(1, n / kGrain)));
  auto* fn = decay ? &run_fp32<true, GradT, CopyT> : &run_fp32<false, GradT, CopyT>;
  // split on multiples of 16 elements (whole cache lines of p, m and v per thread)
  SplitAcrossThreads(t, [&](int i) { return i == t ? n : (n * i / t) & ~int64_t{15}; },
                     [&](int64_t lo, int64_t hi) { fn(lo, hi, s, g, p, copy, m, v); });
  return ffi::Error::Success();
}

// The host step for fp32 moments: p, m and v updated in place (aliased), the copy (bf16 or fp32) of the new p.
ffi::Error AdamF32Impl(ffi::Buffer<ffi::F32> p_in, ffi::AnyBuffer g, ffi::Buffer<ffi::F32> m_in,
                       ffi::Buffer<ffi::F32> v_in, ffi::Buffer<ffi::F32> scalars,
                       ffi::ResultBuffer<ffi::F32> p, ffi::Result<ffi::AnyBuffer> copy,
                       ffi::ResultBuffer<ffi::F32> m, ffi::ResultBuffer<ffi::F32> v, bool decay,
                       int64_t threads) {
  const int64_t n = g.element_count();
  if (p_in.element_count() != n || m_in.element_count() != n || v_in.element_count() != n)
    return ffi::Error::InvalidArgument("adam fp32: p, g, m and v must have one size");
  if (scalars.element_count() != 9) return ffi::Error::InvalidArgument("adam fp32: 9 scalars expected");
  CopyIfNotAliased(p->typed_data(), p_in.typed_data(), n);
  CopyIfNotAliased(m->typed_data(), m_in.typed_data(), n);
  CopyIfNotAliased(v->typed_data(), v_in.typed_data(), n);
  return WithCopy(copy, n, "adam fp32", [&](auto* out) {
    return WithGrad(g, "adam fp32", [&](auto* gp) {
      return RunFp32(n, decay, threads, scalars, gp, p->typed_data(), out, m->typed_data(), v->typed_data());
    });
  });
}

// The same, writing the copy into the previous one's buffer (aliased to `copy`, its contents unread).
ffi::Error AdamF32IntoImpl(ffi::Buffer<ffi::F32> p_in, ffi::AnyBuffer g, ffi::Buffer<ffi::F32> m_in,
                           ffi::Buffer<ffi::F32> v_in, ffi::Buffer<ffi::F32> scalars,
                           ffi::AnyBuffer copy_in, ffi::ResultBuffer<ffi::F32> p,
                           ffi::Result<ffi::AnyBuffer> copy, ffi::ResultBuffer<ffi::F32> m,
                           ffi::ResultBuffer<ffi::F32> v, bool decay, int64_t threads) {
  if (copy_in.element_count() != g.element_count() || copy_in.element_type() != copy->element_type())
    return ffi::Error::InvalidArgument("adam fp32: the previous copy's size or type differs");
  return AdamF32Impl(p_in, g, m_in, v_in, scalars, p, copy, m, v, decay, threads);
}

}  // namespace

// The host step's signature, shared by its two targets (the second takes the previous copy as
// one more argument): p, g (bf16 or f32), codes, scales and the scalars in; p, the copy, codes and
// scales out.
template <typename B>
auto MasterArgs(B binding) {
  return std::move(binding).template Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::S8>>()
      .template Arg<ffi::Buffer<ffi::U8>>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::Buffer<ffi::F32>>();
}

template <typename B>
auto MasterResults(B binding) {
  return std::move(binding).template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::S8>>()
      .template Ret<ffi::Buffer<ffi::U8>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Attr<int64_t>("block_size")
      .template Attr<bool>("decay")
      .template Attr<int64_t>("threads");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(LtAdam8bitCpu, Adam8bitImpl, MasterResults(MasterArgs(ffi::Ffi::Bind())));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LtAdam8bitIntoCpu, Adam8bitIntoImpl,
                              MasterResults(MasterArgs(ffi::Ffi::Bind()).Arg<ffi::AnyBuffer>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LtAdam8bitStateCpu, Adam8bitStateImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("threads"));

// The fp32-moment host step: p, g (bf16 or f32), m, v and the scalars in; p, the copy, m and v out.
template <typename B>
auto F32Args(B binding) {
  return std::move(binding).template Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::Buffer<ffi::F32>>();
}

template <typename B>
auto F32Results(B binding) {
  return std::move(binding).template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Attr<bool>("decay")
      .template Attr<int64_t>("threads");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(LtAdamF32Cpu, AdamF32Impl, F32Results(F32Args(ffi::Ffi::Bind())));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LtAdamF32IntoCpu, AdamF32IntoImpl,
                              F32Results(F32Args(ffi::Ffi::Bind()).Arg<ffi::AnyBuffer>()));
