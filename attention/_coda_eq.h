// CoDA's Eq. 1-6 element-wise in float32 for the paper's functions (F_E = tanh, F_N =
// sigmoid, uncentred) and its derivative (attention/coda.py's _forward_block and
// _backward_block), with the mask (bytes, 0 = masked) and the dropout from uniforms u (kept
// where u >= p, scaled by 1 / (1 - p)).  One implementation, eq_values, on one vector of
// values; attention/_coda_l1.cpp applies it in a separate pass over whole tiles (eq_run:
// coda_eq_{forward,backward}_f32) and inside the L1 forward kernel's tiles while q.k and D
// are in L1 (coda_fused_{forward,backward}_f32), so both give the same bits.  exp: Cephes'
// single-precision polynomial (about 1 ulp on [-87.3, 88]); tanh and sigmoid from it, within
// about 1.5e-7 absolute of torch's (tests/attention/test_coda_kernels.py).
#pragma once

#include "_simd.h"

namespace {

using VF = Vec<float>::V;
using VI = Vec<float>::I;
using VM = Vec<float>::M;
constexpr int WF = VBYTES / 4;

__attribute__((always_inline)) inline VF vexp(VF x) {
  x = x > splat<float>(88.0f) ? splat<float>(88.0f) : x;
  x = x < splat<float>(-87.3f) ? splat<float>(-87.3f) : x;
  const VF magic = splat<float>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const VF n = (x * 1.44269504088896341f + magic) - magic;
  VF r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  VF p = splat<float>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const VF y = p * (r * r) + r + 1.0f;
  const VI e = (__builtin_convertvector(n, VI) + 127) << 23;  // 2^n
  return y * (VF)e;
}

__attribute__((always_inline)) inline VF vtanh(VF x) {
  const VI sign = VI{} + INT32_MIN;
  const VF t = vexp((VF)((VI)x | sign) * 2.0f);  // exp(-2|x|), in (0, 1]
  const VF y = (1.0f - t) / (1.0f + t);
  return (VF)((VI)y | ((VI)x & sign));
}

__attribute__((always_inline)) inline VF vsigmoid(VF x) { return 1.0f / (1.0f + vexp(-x)); }

// the scales: es = alpha s, ns = -beta s, gs = 2 for the scaled gate, else 1; the dropout
// rate p and its scale ps = 1 / (1 - p)
struct EqScales {
  float es, ns, gs, p, ps;
};

inline EqScales eq_scales(float es, float ns, float gs, double p) {
  return {es, ns, gs, (float)p, 1.0f / (float)(1.0 - p)};
}

// one vector of Eq. 1-6's inputs ...
struct EqIn {
  VF qk, dist;
  VI valid;    // all bits set where not masked
  VF keep;     // the dropout's factors (0 or ps), with dropout
  VF d_md;     // backward: dL/d(M with dropout), 0 where there is none
  VF d_w;      // backward: dL/dM (the weights output), with has_dw
  bool dropout, has_dw;
};

// ... and its outputs (de, dn in the backward only)
struct EqOut {
  VF m, md, de, dn;
};

__attribute__((always_inline)) inline VI eq_valid(VM mask) {
  return __builtin_convertvector(mask, VI) != 0;
}

__attribute__((always_inline)) inline VF eq_keep(VF u, const EqScales& s) {
  return u >= s.p ? splat<float>(s.ps) : VF{};
}

// M = tanh(es q.k) gs sigmoid(ns D), 0 where masked, and M with dropout; BACKWARD: also
// dL/d(q.k) and dL/dD by the chain rule from dL/d(M with dropout) and dL/dM
template <bool BACKWARD>
__attribute__((always_inline)) inline EqOut eq_values(const EqIn& x, const EqScales& s) {
  const VF te = vtanh(x.qk * s.es);
  const VF gn = vsigmoid(x.dist * s.ns);
  const VF g = gn * s.gs;
  EqOut o;
  o.m = x.valid ? te * g : VF{};
  o.md = x.dropout ? o.m * x.keep : o.m;
  if constexpr (BACKWARD) {
    VF dm = x.d_md;
    if (x.dropout) dm = dm * x.keep;
    if (x.has_dw) dm = dm + x.d_w;
    dm = x.valid ? dm : VF{};
    o.de = (dm * g * (1.0f - te * te)) * s.es;
    o.dn = (dm * te * (gn * (1.0f - gn) * s.gs)) * s.ns;
  }
  return o;
}

// Eq. 1-6 over arrays of one layout ((n, r, lk) tiles, or a row's piece of one); null
// pointers: absent inputs, unwanted outputs
struct Eq {
  const float *qk, *dist, *u, *d_md, *d_w;
  const uint8_t* mask;
  float *m, *md, *de, *dn;
  EqScales s;

  // the same arrays from element `off` on (null stays null)
  Eq shifted(int64_t off) const {
    auto at = [off](auto* p) { return p ? p + off : p; };
    return {at(qk), at(dist), at(u), at(d_md), at(d_w), at(mask), at(m), at(md), at(de),
            at(dn), s};
  }
};

// WF elements at offset i of every array of a (pointers as given or WF-long buffers)
template <bool BACKWARD>
__attribute__((always_inline)) inline void eq_vector(const Eq& a, int64_t i) {
  EqIn x;
  x.qk = load<VF>(a.qk + i);
  x.dist = load<VF>(a.dist + i);
  x.valid = a.mask ? eq_valid(load<VM>(a.mask + i)) : VI{} - 1;
  x.dropout = a.u != nullptr;
  x.keep = x.dropout ? eq_keep(load<VF>(a.u + i), a.s) : VF{};
  x.d_md = a.d_md ? load<VF>(a.d_md + i) : VF{};
  x.has_dw = a.d_w != nullptr;
  x.d_w = x.has_dw ? load<VF>(a.d_w + i) : VF{};
  const EqOut o = eq_values<BACKWARD>(x, a.s);
  if (a.m) store(a.m + i, o.m);
  if (a.md) store(a.md + i, o.md);
  if constexpr (BACKWARD) {
    store(a.de + i, o.de);
    store(a.dn + i, o.dn);
  }
}

// the last n < WF elements from i0 on through buffers of WF lanes (each lane as in eq_vector)
template <bool BACKWARD>
void eq_tail(const Eq& a, int64_t i0, int64_t n) {
  float in[5][WF] = {}, out[4][WF] = {};
  uint8_t mbuf[WF] = {};
  const float* src[5] = {a.qk, a.dist, a.u, a.d_md, a.d_w};
  float* dst[4] = {a.m, a.md, a.de, a.dn};
  Eq b = a;
  const float** bsrc[5] = {&b.qk, &b.dist, &b.u, &b.d_md, &b.d_w};
  float** bdst[4] = {&b.m, &b.md, &b.de, &b.dn};
  for (int s = 0; s < 5; ++s)
    if (src[s]) {
      std::copy(src[s] + i0, src[s] + i0 + n, in[s]);
      *bsrc[s] = in[s];
    }
  if (a.mask) {
    std::copy(a.mask + i0, a.mask + i0 + n, mbuf);
    b.mask = mbuf;
  }
  for (int s = 0; s < 4; ++s)
    if (dst[s]) *bdst[s] = out[s];
  eq_vector<BACKWARD>(b, 0);
  for (int s = 0; s < 4; ++s)
    if (dst[s]) std::copy(out[s], out[s] + n, dst[s] + i0);
}

// elements 0..count of a's arrays
template <bool BACKWARD>
__attribute__((always_inline)) inline void eq_span(const Eq& a, int64_t count) {
  int64_t i = 0;
  for (; i + WF <= count; i += WF) eq_vector<BACKWARD>(a, i);
  if (i < count) eq_tail<BACKWARD>(a, i, count - i);
}

// the separate pass: `count` elements of contiguous tiles
template <bool BACKWARD>
void eq_run(const Eq& a, int64_t count, int nthreads) {
  constexpr int64_t kChunk = 64 * WF;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  parallel(chunks, nthreads, kChunk * 64, int64_t(1) << 18, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t i0 = c * kChunk, i1 = std::min(count, i0 + kChunk);
      eq_span<BACKWARD>(a.shifted(i0), i1 - i0);
    }
  });
}

}  // namespace
