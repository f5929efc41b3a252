// Fused 8-bit AdamW for one fp32 tensor on the CPU, as an XLA FFI custom call.
//
// One pass per block of `block_size` elements: the block's scale bounds from max|g| and the
// codes' maxima (kernel._scale_bounds), then clip, Adam, decoupled weight decay, the fp32 master
// update, the bf16 streaming copy and the requantized dynamic8 codes. The block stays in L1, so
// memory sees each byte once: read p g mc vc, write p copy mc vc (18 B/param). Blocks are split
// across threads. Same math as lazytrain_jax/optim/kernel.py (dynamic8); see ../native.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sched.h>
#include <thread>
#include <vector>

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

// Compile-time flags (a runtime one keeps the loop from vectorizing): kDecay, weight decay on
// this tensor; kMaster, the host step (p updated in place, bf16 copy written; `out` is the copy)
// or else the optax update (p only read; `out` receives the fp32 update u, 0 on a skipped step).
template <bool kDecay, bool kMaster>
void run_blocks(int64_t b0, int64_t b1_end, int64_t bs, const Scalars s,
                const float* __restrict__ g, float* __restrict__ p, void* __restrict__ out,
                int8_t* __restrict__ mc, uint8_t* __restrict__ vc, float* __restrict__ ms,
                float* __restrict__ vs) {
  const float om1 = 1.0f - s.b1, om2 = 1.0f - s.b2;
  for (int64_t blk = b0; blk < b1_end; ++blk) {
    const int64_t o = blk * bs;
    const float* __restrict__ gb = g + o;
    float* __restrict__ pb = p + o;
    uint16_t* __restrict__ cb = static_cast<uint16_t*>(out) + o;
    float* __restrict__ ub = static_cast<float*>(out) + o;
    int8_t* __restrict__ mb = mc + o;
    uint8_t* __restrict__ vb = vc + o;
    if (s.apply == 0.0f) {  // skipped step: only the copy (or a zero update) is written
      if constexpr (kMaster) {
        for (int64_t i = 0; i < bs; ++i) cb[i] = to_bf16(pb[i]);
      } else {
        std::memset(ub, 0, bs * sizeof(float));
      }
      continue;
    }
    float gmax = 0.0f;
    int mmax = 0, vmax = 0;
#pragma omp simd reduction(max : gmax, mmax, vmax)
    for (int64_t i = 0; i < bs; ++i) {
      gmax = std::max(gmax, std::fabs(gb[i]));
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
#pragma omp simd
    for (int64_t i = 0; i < bs; ++i) {
      const float k = static_cast<float>(vb[i]);
      const float q = (k * k) * kInvV2;
      const float v_old = sv_old * (q * q);
      const float c = static_cast<float>(mb[i]);
      const float m_old = v_old == 0.0f ? 0.0f : sm_old * ((c * std::fabs(c)) * kInvM2);
      const float gg = gb[i] * s.clip;
      const float m = om1 * gg + s.b1 * m_old;
      const float v = om2 * (gg * gg) + s.b2 * v_old;
      const float rv = std::sqrt(v);  // shared by the update and the v code's estimate
      float u = (m * s.inv_bc1) / (rv * s.rsqrt_bc2 + s.eps);
      if constexpr (kDecay) u = u + s.wd * pb[i];
      u = -s.lr * u;
      if constexpr (kMaster) {
        const float np = pb[i] + u;
        pb[i] = np;
        cb[i] = to_bf16(np);
      } else {
        ub[i] = u;
      }
      // um, uv: the moments over their block scales, exactly as XLA's (x / 64) * (64 / s)
      // (a power-of-two factor moves no rounding). The code estimates need no clamp at 0
      // (roots are >= 0; NaN stays NaN either way) and only pick the pair {t, t + 1} that
      // the exact midpoint test below chooses from.
      const float um = std::fabs(m) * inv_m;
      float t = std::min(std::floor(127.0f * std::sqrt(um)), 126.0f);
      float t1 = t + 1.0f;
      float code = um * kMidM > t * t1 * 2.0f + 1.0f ? t1 : t;
      mb[i] = static_cast<int8_t>(std::copysign(code, m));  // -0 and +0 both give code 0
      const float uv = v * inv_v;
      t = std::min(std::floor(255.0f * std::sqrt(rv * rinv_v)), 254.0f);
      t1 = t + 1.0f;
      const float t2 = t * t, t12 = t1 * t1;
      vb[i] = static_cast<uint8_t>(uv * kMidV > t2 * t2 + t12 * t12 ? t1 : t);
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

template <bool kMaster>
ffi::Error Run(int64_t n, int64_t block_size, bool decay, int64_t threads,
               ffi::Buffer<ffi::F32> scalars, const float* g, float* p, void* out, int8_t* mc,
               uint8_t* vc, float* ms, float* vs) {
  const float* sc = scalars.typed_data();
  Scalars s{sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7], sc[8]};
  s.rsqrt_bc2 = std::sqrt(s.inv_bc2);
  const int64_t nb = n / block_size;
  const int t = static_cast<int>(
      std::min<int64_t>(num_threads(threads), std::max<int64_t>(1, nb / 64)));
  auto work = [&](int64_t lo, int64_t hi) {
    auto* fn = decay ? &run_blocks<true, kMaster> : &run_blocks<false, kMaster>;
    fn(lo, hi, block_size, s, g, p, out, mc, vc, ms, vs);
  };
  if (t <= 1) {
    work(0, nb);
  } else {
    std::vector<std::thread> pool;
    for (int i = 1; i < t; ++i) pool.emplace_back(work, nb * i / t, nb * (i + 1) / t);
    work(0, nb / t);
    for (auto& th : pool) th.join();
  }
  return ffi::Error::Success();
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

// The host step: p, codes and scales updated in place (aliased), bf16 copy of the new p.
ffi::Error Adam8bitImpl(ffi::Buffer<ffi::F32> p_in, ffi::Buffer<ffi::F32> g,
                        ffi::Buffer<ffi::S8> mc_in, ffi::Buffer<ffi::U8> vc_in,
                        ffi::Buffer<ffi::F32> ms_in, ffi::Buffer<ffi::F32> vs_in,
                        ffi::Buffer<ffi::F32> scalars, ffi::ResultBuffer<ffi::F32> p,
                        ffi::ResultBuffer<ffi::BF16> copy, ffi::ResultBuffer<ffi::S8> mc,
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
  return Run<true>(n, block_size, decay, threads, scalars, g.typed_data(), p->typed_data(),
                   copy->typed_data(), mc->typed_data(), vc->typed_data(), ms->typed_data(),
                   vs->typed_data());
}

// The optax update: p only read; returns u and the new codes and scales (aliased).
ffi::Error Adam8bitUpdateImpl(ffi::Buffer<ffi::F32> p, ffi::Buffer<ffi::F32> g,
                              ffi::Buffer<ffi::S8> mc_in, ffi::Buffer<ffi::U8> vc_in,
                              ffi::Buffer<ffi::F32> ms_in, ffi::Buffer<ffi::F32> vs_in,
                              ffi::Buffer<ffi::F32> scalars, ffi::ResultBuffer<ffi::F32> u,
                              ffi::ResultBuffer<ffi::S8> mc, ffi::ResultBuffer<ffi::U8> vc,
                              ffi::ResultBuffer<ffi::F32> ms, ffi::ResultBuffer<ffi::F32> vs,
                              int64_t block_size, bool decay, int64_t threads) {
  const int64_t n = g.element_count(), nb = ms_in.element_count();
  ffi::Error err = CheckShapes(n, block_size, nb, scalars.element_count());
  if (err.failure()) return err;
  CopyIfNotAliased(mc->typed_data(), mc_in.typed_data(), n);
  CopyIfNotAliased(vc->typed_data(), vc_in.typed_data(), n);
  CopyIfNotAliased(ms->typed_data(), ms_in.typed_data(), nb);
  CopyIfNotAliased(vs->typed_data(), vs_in.typed_data(), nb);
  // p is read, never written (const_cast only to share the loop with the host step)
  return Run<false>(n, block_size, decay, threads, scalars, g.typed_data(),
                    const_cast<float*>(p.typed_data()), u->typed_data(), mc->typed_data(),
                    vc->typed_data(), ms->typed_data(), vs->typed_data());
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LtAdam8bitCpu, Adam8bitImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size")
                                  .Attr<bool>("decay")
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LtAdam8bitUpdateCpu, Adam8bitUpdateImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size")
                                  .Attr<bool>("decay")
                                  .Attr<int64_t>("threads"));
