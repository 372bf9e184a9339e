// CoDA's L1 term on CPU, with the products beside it (attention/_coda_l1_ext.py builds and
// loads this file: a plain C interface, no torch header, so it compiles in about a second
// and needs no ninja).  For n independent matrices, q (n,r,d), k (n,lk,d), all contiguous:
//
//   coda_l1_forward_{f32,f64}   D_ij = sum_t |q_it - k_jt|, and optionally q_i.k_j and a
//                               third product a_i.b_j (a (n,r,d2), b (n,lk,d2)), each
//                               (n,r,lk), in one pass over tiles of keys
//   coda_l1_grads_{f32,f64}     the gradients of sum_ij (w_ij D_ij + e_ij q_i.k_j) (e
//                               optional): gq_i = sum_j w_ij sign(q_i - k_j) + e_ij k_j,
//                               written, gk_j += sum_i w_ij sign(k_j - q_i) + e_ij q_i,
//                               accumulated (one call per tile of rows)
//   coda_eq_{forward,backward}_f32
//                               Eq. 1-6 element-wise for the paper's functions (tanh(E),
//                               sigmoid(N), uncentred) and its derivative, with the mask and
//                               the dropout (from uniforms) applied: attention/coda.py's
//                               _forward_block and _backward_block in one pass
//                               (attention/_coda_eq.h)
//   coda_fused_{forward,backward}_f32
//                               the forward kernel's q.k and D (and a.b) with Eq. 1-6 (its
//                               derivative) applied to each tile while it is in L1: M and M
//                               with dropout (dL/d(q.k), dL/dD, M with dropout) straight from
//                               q, k (a, b); the same results as the two calls above
//
// sign(0) = 0, as autograd's abs (ties are common).  Nothing of size r*lk*d is stored: tiles
// reduce in registers.
//
// Vectorisation: GCC vector extensions of VBYTES bytes, set by the instruction set the file
// is compiled for (the loader picks -mavx512f..., -mavx2 -mfma or the compiler's default from
// torch's run-time CPU detection: one build per capability, no -march=native), and one
// AVX-512 intrinsic (a ternary-logic instruction for w sign(x)).
//   forward: (float32 on AVX-512, fewer than 64 keys, not a multiple of 16: flat tiles, lanes
//            over the keys of consecutive matrices; see flat_forward) otherwise
//            vectorised over keys j; a tile of keys is transposed into a (d, JT) buffer that
//            stays in L1 while every row of q passes over it, IT query rows x J vectors of
//            keys per register tile; |q - k| is 3 vector operations (sub, and, add), q.k one
//            fused multiply-add beside them, in the pipes the L1 term leaves idle.
//   grads:   vectorised over t (rows of q and k), GI query rows x TV vectors of t per tile
//            (each broadcast of w_ij, e_ij serves TV vectors); gq accumulated in registers
//            over the keys, gk once per key for GI rows.
// Threads: OpenMP when built with it (sharing torch's libgomp and so its threads), else
// std::thread; nthreads from torch.get_num_threads(); work split over the matrices and the
// tiles of keys (and, for the gradients of few matrices, over chunks of keys).

#include <type_traits>

#include "_coda_eq.h"
#include "_simd.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// work per thread at least (units of parallel(): element operations)
constexpr int64_t kGrain = 1 << 18;

// -- forward: D = sum_t |q_it - k_jt| (and q.k) ---------------------------------------------
constexpr int IT = 4;  // query rows per tile
// key vectors per tile: D alone, D and q.k (twice the accumulators)
constexpr int JV = VBYTES == 64 ? 4 : 2;
constexpr int JV_QK = VBYTES == 64 ? 2 : 1;

template <typename T, bool QK>
__attribute__((always_inline)) inline void l1_tile(const T* __restrict q, int64_t d,
                                                  const T* __restrict kt, int64_t ldk,
                                                  T* __restrict out, T* __restrict dot_out,
                                                  int64_t ldo) {
  using V = typename Vec<T>::V;
  using I = typename Vec<T>::I;
  constexpr int W = VBYTES / sizeof(T);
  constexpr int J = QK ? JV_QK : JV;
  const I absmask = ~I{} ^ Vec<T>::kSign;  // every bit but the sign
  V acc[IT][J], dot[IT][J];
#pragma GCC unroll 16
  for (int ii = 0; ii < IT; ++ii)
#pragma GCC unroll 16
    for (int jv = 0; jv < J; ++jv) acc[ii][jv] = dot[ii][jv] = V{};
  for (int64_t t = 0; t < d; ++t) {
    V kv[J];
#pragma GCC unroll 16
    for (int jv = 0; jv < J; ++jv) kv[jv] = load<V>(kt + t * ldk + jv * W);
#pragma GCC unroll 16
    for (int ii = 0; ii < IT; ++ii) {
      const T qs = q[ii * d + t];
#pragma GCC unroll 16
      for (int jv = 0; jv < J; ++jv) {
        acc[ii][jv] += (V)((I)(qs - kv[jv]) & absmask);
        if constexpr (QK) dot[ii][jv] += qs * kv[jv];  // a fused multiply-add where there is one
      }
    }
  }
#pragma GCC unroll 16
  for (int ii = 0; ii < IT; ++ii)
#pragma GCC unroll 16
    for (int jv = 0; jv < J; ++jv) {
      store(out + ii * ldo + jv * W, acc[ii][jv]);
      if constexpr (QK) store(dot_out + ii * ldo + jv * W, dot[ii][jv]);
    }
}

// IT rows of a (stride da) times a packed tile of keys bt (da, ldb): J vectors of products
template <typename T, int J>
__attribute__((always_inline)) inline void dot_tile(const T* __restrict a, int64_t da,
                                                   const T* __restrict bt, int64_t ldb,
                                                   T* __restrict out, int64_t ldo) {
  using V = typename Vec<T>::V;
  constexpr int W = VBYTES / sizeof(T);
  V dot[IT][J];
#pragma GCC unroll 16
  for (int ii = 0; ii < IT; ++ii)
#pragma GCC unroll 16
    for (int jv = 0; jv < J; ++jv) dot[ii][jv] = V{};
  for (int64_t t = 0; t < da; ++t) {
    V bv[J];
#pragma GCC unroll 16
    for (int jv = 0; jv < J; ++jv) bv[jv] = load<V>(bt + t * ldb + jv * W);
#pragma GCC unroll 16
    for (int ii = 0; ii < IT; ++ii) {
      const T as = a[ii * da + t];
#pragma GCC unroll 16
      for (int jv = 0; jv < J; ++jv) dot[ii][jv] += as * bv[jv];
    }
  }
#pragma GCC unroll 16
  for (int ii = 0; ii < IT; ++ii)
#pragma GCC unroll 16
    for (int jv = 0; jv < J; ++jv) store(out + ii * ldo + jv * W, dot[ii][jv]);
}

// the rows i0:i0+in of a tile of keys; a full tile written in place, a partial one through
// zero-padded buffers
template <typename T, typename F>
__attribute__((always_inline)) inline void row_tiles(const T* x, int64_t dx, int64_t r,
                                                    int64_t lk, int64_t jn, int64_t jt,
                                                    T* out, T* out2, std::vector<T>& xbuf,
                                                    std::vector<T>& obuf,
                                                    std::vector<T>& obuf2, F&& tile) {
  for (int64_t i0 = 0; i0 < r; i0 += IT) {
    const int64_t in = std::min<int64_t>(IT, r - i0);
    if (in == IT && jn == jt) {
      tile(x + i0 * dx, out + i0 * lk, out2 ? out2 + i0 * lk : nullptr, lk);
      continue;
    }
    std::fill(xbuf.begin(), xbuf.end(), T(0));
    std::copy(x + i0 * dx, x + (i0 + in) * dx, xbuf.data());
    tile(xbuf.data(), obuf.data(), obuf2.data(), jt);
    for (int64_t ii = 0; ii < in; ++ii) {
      std::copy(&obuf[ii * jt], &obuf[ii * jt] + jn, out + (i0 + ii) * lk);
      if (out2) std::copy(&obuf2[ii * jt], &obuf2[ii * jt] + jn, out2 + (i0 + ii) * lk);
    }
  }
}

// keys j0:j0+jn of y (lk, dy) transposed into buf (dy, jt), zero-padded
template <typename T>
inline void pack(const T* y, int64_t dy, int64_t j0, int64_t jn, int64_t jt,
                 std::vector<T>& buf) {
  if (jn < jt) std::fill(buf.begin(), buf.end(), T(0));
  const T* rows = y + j0 * dy;
  for (int64_t jj = 0; jj < jn; ++jj)
    for (int64_t t = 0; t < dy; ++t) buf[t * jt + jj] = rows[jj * dy + t];
}

// -- short keys (AVX-512, float32): lanes over the keys of consecutive matrices ------------
// Where lk is short (the MLU's 4-18 tokens), tiles of 16 or 32 keys of one matrix are mostly
// padding and every row tile goes through row_tiles' buffers.  Here k (n, lk, d) is read as
// the n*lk keys of all matrices in a row: a tile of 16 lanes holds keys of up to kFlatSegs
// consecutive matrices (segments), each lane gets q's value of its own matrix by masked
// broadcasts, and the outputs go out by masked stores, one per segment: no padded lanes
// (but the last tile's) and no buffers.  The same sums over t in the same order as
// l1_tile's, so the same results.
#if VBYTES == 64
constexpr int kFlatSegs = 4;  // matrices per tile at most (lk >= 5: any 16 keys span <= 4)

struct FlatTile {
  int nseg;
  int64_t m[16];        // the segments' matrices
  __mmask16 mask[16];   // their lanes
  int64_t shift[16];    // output offset of lane 0 within the segment's row (j0 - lane0)
};

// RT rows (row0..row0+RT-1) of one tile of keys kt (d, 16): the sums over t of |x - y|
// (with L1) into acc and of x.y into dt, lane by lane; x (n, r, d)
template <int NS, int RT, bool L1>
__attribute__((always_inline)) inline void flat_sums(const float* __restrict x, int64_t r,
                                                    int64_t d, const float* __restrict kt,
                                                    const FlatTile& ft, int64_t row0,
                                                    __m512 (&acc)[RT], __m512 (&dt)[RT]) {
  const int ns = NS ? NS : ft.nseg;
  const float* xp[16][RT];
  for (int s = 0; s < ns; ++s)
    for (int ii = 0; ii < RT; ++ii) xp[s][ii] = x + (ft.m[s] * r + row0 + ii) * d;
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
#pragma GCC unroll 16
  for (int ii = 0; ii < RT; ++ii) acc[ii] = dt[ii] = _mm512_setzero_ps();
  for (int64_t t = 0; t < d; ++t) {
    const __m512 kv = _mm512_loadu_ps(kt + t * 16);
#pragma GCC unroll 16
    for (int ii = 0; ii < RT; ++ii) {
      __m512 xv = _mm512_set1_ps(xp[0][ii][t]);
#pragma GCC unroll 16
      for (int s = 1; s < ns; ++s)
        xv = _mm512_mask_mov_ps(xv, ft.mask[s], _mm512_set1_ps(xp[s][ii][t]));
      if constexpr (L1)
        acc[ii] = _mm512_add_ps(acc[ii], _mm512_castsi512_ps(_mm512_and_si512(
            _mm512_castps_si512(_mm512_sub_ps(xv, kv)), absmask)));
      dt[ii] = _mm512_fmadd_ps(xv, kv, dt[ii]);
    }
  }
}

// where row `row`'s lanes go in each segment's (r, lk) output: lane 0's offset (the segment's
// lanes are its mask's)
inline void flat_offsets(const FlatTile& ft, int ns, int64_t r, int64_t row, int64_t lk,
                         int64_t (&at)[16]) {
  for (int s = 0; s < ns; ++s) at[s] = (ft.m[s] * r + row) * lk + ft.shift[s];
}

// RT rows of one tile of keys: D (with L1) and x.y into the segments' outputs (n, r, lk)
template <int NS, int RT, bool L1>
__attribute__((always_inline)) inline void flat_rows(const float* __restrict x, int64_t r,
                                                    int64_t d, const float* __restrict kt,
                                                    const FlatTile& ft, int64_t row0,
                                                    int64_t lk, float* __restrict out,
                                                    float* __restrict dot) {
  const int ns = NS ? NS : ft.nseg;
  __m512 acc[RT], dt[RT];
  flat_sums<NS, RT, L1>(x, r, d, kt, ft, row0, acc, dt);
#pragma GCC unroll 16
  for (int ii = 0; ii < RT; ++ii) {
    int64_t at[16];
    flat_offsets(ft, ns, r, row0 + ii, lk, at);
    for (int s = 0; s < ns; ++s) {
      if constexpr (L1) _mm512_mask_storeu_ps(out + at[s], ft.mask[s], acc[ii]);
      _mm512_mask_storeu_ps(dot + at[s], ft.mask[s], dt[ii]);
    }
  }
}

// rows(NS, RT, row0, ft, kt, bt) over the rows of one flat tile: blocks of IT rows, then one
// by one (NS, RT as std::integral_constant)
template <int NS, typename F>
inline void flat_row_blocks(int64_t r, const FlatTile& ft, const float* kt, const float* bt,
                            F& rows) {
  using S = std::integral_constant<int, NS>;
  int64_t i0 = 0;
  for (; i0 + IT <= r; i0 += IT) rows(S{}, std::integral_constant<int, IT>{}, i0, ft, kt, bt);
  for (; i0 < r; ++i0) rows(S{}, std::integral_constant<int, 1>{}, i0, ft, kt, bt);
}

// the flat tiles of 16 keys of y (n, lk, d) read as (n*lk, d), and of yb (n, lk, d2) unless
// null: each tile's keys transposed into kt (d, 16) (and bt (d2, 16)), its segments found,
// then rows(...) over its rows (flat_row_blocks); `work`: element operations per (i, j)
template <typename F>
void flat_walk(const float* y, const float* yb, int64_t n, int64_t r, int64_t lk, int64_t d,
               int64_t d2, int64_t work, int nthreads, F&& rows) {
  const int64_t total = n * lk, tiles = (total + 15) / 16;
  parallel(tiles, nthreads, r * 16 * work, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> kbuf(d * 16), bbuf(yb ? d2 * 16 : 0);
    FlatTile ft;
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t g0 = tile * 16, gn = std::min<int64_t>(16, total - g0);
      pack(y, d, g0, gn, 16, kbuf);  // keys g0.. of every matrix in a row
      if (yb) pack(yb, d2, g0, gn, 16, bbuf);
      ft.nseg = 0;
      for (int64_t g = g0; g < g0 + gn;) {
        const int64_t m = g / lk, stop = std::min((m + 1) * lk, g0 + gn);
        const int lane0 = static_cast<int>(g - g0), lanes = static_cast<int>(stop - g);
        ft.m[ft.nseg] = m;
        ft.mask[ft.nseg] = static_cast<__mmask16>(((1u << lanes) - 1u) << lane0);
        ft.shift[ft.nseg] = (g - m * lk) - lane0;
        ++ft.nseg;
        g = stop;
      }
      const float *kt = kbuf.data(), *bt = bbuf.data();
      switch (ft.nseg) {
        case 1: flat_row_blocks<1>(r, ft, kt, bt, rows); break;
        case 2: flat_row_blocks<2>(r, ft, kt, bt, rows); break;
        case 3: flat_row_blocks<3>(r, ft, kt, bt, rows); break;
        case 4: flat_row_blocks<4>(r, ft, kt, bt, rows); break;
        default: flat_row_blocks<0>(r, ft, kt, bt, rows); break;
      }
    }
  });
}

// D (with L1) and x.y (n, r, lk) of x (n, r, d), y (n, lk, d) over flat tiles of 16 keys
template <bool L1>
void flat_forward(const float* x, const float* y, float* out, float* dot, int64_t n, int64_t r,
                  int64_t lk, int64_t d, int nthreads) {
  flat_walk(y, nullptr, n, r, lk, d, 0, d, nthreads,
            [&](auto ns, auto rt, int64_t row0, const FlatTile& ft, const float* kt,
                const float*) {
              flat_rows<decltype(ns)::value, decltype(rt)::value, L1>(x, r, d, kt, ft, row0,
                                                                      lk, out, dot);
            });
}
#endif

// whether flat_forward computes this call: short keys, float32, AVX-512 (a tile of one
// matrix's keys would be at least a fifth padding)
template <typename T>
inline bool flat_keys(int64_t lk) {
#if VBYTES == 64
  return sizeof(T) == 4 && lk < 64 && lk % 16 != 0;
#else
  (void)lk;
  return false;
#endif
}

// D (and q.k with QK, and a.b unless a is null), each (n, r, lk)
template <typename T, bool QK>
void l1_forward(const T* q, const T* k, T* out, T* dot, const T* a, const T* b, T* dot2,
                int64_t n, int64_t r, int64_t lk, int64_t d, int64_t d2, int nthreads) {
#if VBYTES == 64
  if constexpr (sizeof(T) == 4 && QK) {
    if (flat_keys<T>(lk)) {
      flat_forward<true>(q, k, out, dot, n, r, lk, d, nthreads);
      if (a) flat_forward<false>(a, b, nullptr, dot2, n, r, lk, d2, nthreads);
      return;
    }
  }
#endif
  constexpr int W = VBYTES / sizeof(T);
  constexpr int J = QK ? JV_QK : JV;
  constexpr int JT = J * W;  // keys per tile
  const int64_t itiles = (r + IT - 1) / IT;
  const int64_t jtiles = (lk + JT - 1) / JT;
  // work items: (matrix, tile of keys), the tile's keys transposed into a (d, JT) buffer that
  // stays in L1 while every row of q passes over it
  parallel(n * jtiles, nthreads, IT * itiles * JT * (d + (a ? d2 : 0)), kGrain,
           [&](int64_t begin, int64_t end) {
    std::vector<T> kbuf(d * JT), bbuf(a ? d2 * JT : 0), xbuf(IT * std::max(d, d2));
    std::vector<T> obuf(IT * JT), obuf2(IT * JT);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t m = item / jtiles, j0 = (item % jtiles) * JT;
      const int64_t jn = std::min<int64_t>(JT, lk - j0);
      const int64_t at = m * r * lk + j0;  // the tile's first output
      pack(k + m * lk * d, d, j0, jn, JT, kbuf);
      row_tiles(q + m * r * d, d, r, lk, jn, JT, out + at, QK ? dot + at : nullptr, xbuf, obuf,
                obuf2, [&](const T* x, T* o, T* o2, int64_t ldo) {
                  l1_tile<T, QK>(x, d, kbuf.data(), JT, o, o2, ldo);
                });
      if (!a) continue;
      pack(b + m * lk * d2, d2, j0, jn, JT, bbuf);
      row_tiles(a + m * r * d2, d2, r, lk, jn, JT, dot2 + at, static_cast<T*>(nullptr), xbuf,
                obuf, obuf2, [&](const T* x, T* o, T*, int64_t ldo) {
                  dot_tile<T, J>(x, d2, bbuf.data(), JT, o, ldo);
                });
    }
  });
}

// -- gradients of sum_ij (w_ij D_ij + e_ij q_i.k_j) -----------------------------------------
//     gq_i  = sum_j w_ij sign(q_i - k_j) + e_ij k_j
//     gk_j += sum_i w_ij sign(k_j - q_i) + e_ij q_i
constexpr int GI = 2;  // query rows per tile (a power of 2)
constexpr int TV = VBYTES == 64 ? 4 : 2;  // vectors of t per tile, at most
constexpr int64_t GJ = 256;  // keys per chunk (the tile's rows of w and e stay in L1)

// w sign(x) where x != 0, else 0
template <typename T>
__attribute__((always_inline)) inline typename Vec<T>::V signed_weight(typename Vec<T>::V x,
                                                                      T w) {
  using V = typename Vec<T>::V;
  using I = typename Vec<T>::I;
#if VBYTES == 64
  if constexpr (sizeof(T) == 4) {  // one ternary-logic instruction: (x & sign) ^ w, zeroed
    const __mmask16 nz = _mm512_cmp_ps_mask((__m512)x, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    return (V)_mm512_maskz_ternarylogic_epi32(nz, (__m512i)x, _mm512_set1_epi32(INT32_MIN),
                                              (__m512i)_mm512_set1_ps(w), 0x6A);
  } else {
    const __mmask8 nz = _mm512_cmp_pd_mask((__m512d)x, _mm512_setzero_pd(), _CMP_NEQ_UQ);
    return (V)_mm512_maskz_ternarylogic_epi64(nz, (__m512i)x, _mm512_set1_epi64(INT64_MIN),
                                              (__m512i)_mm512_set1_pd(w), 0x6A);
  }
#else
  const I sign = I{} + Vec<T>::kSign;
  const V s = (V)(((I)x & sign) ^ (I)splat<T>(w));
  return x != V{} ? s : V{};
#endif
}

// One tile: GI rows of q (stride ldq), keys k (jn, stride ldk), w and e (GI, stride ldw),
// TV vectors of t: gq (GI, stride ldq) += ..., gk (jn, stride ldk) += ...  Few rows and
// several vectors of t: each broadcast of w_ij and e_ij serves TV vectors.
template <typename T, bool E, int TV>
__attribute__((always_inline)) inline void grad_tile(const T* __restrict q, int64_t ldq,
                                                    const T* __restrict k, int64_t ldk,
                                                    const T* __restrict w,
                                                    const T* __restrict e, int64_t ldw,
                                                    int64_t jn, T* __restrict gq,
                                                    T* __restrict gk) {
  using V = typename Vec<T>::V;
  constexpr int W = VBYTES / sizeof(T);
  V qv[GI][TV], acc[GI][TV];
#pragma GCC unroll 16
  for (int ii = 0; ii < GI; ++ii)
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) {
      qv[ii][tv] = load<V>(q + ii * ldq + tv * W);
      acc[ii][tv] = load<V>(gq + ii * ldq + tv * W);
    }
  for (int64_t j = 0; j < jn; ++j) {
    V kv[TV], y[GI][TV];  // y: the share of gk_j of each row
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) kv[tv] = load<V>(k + j * ldk + tv * W);
#pragma GCC unroll 16
    for (int ii = 0; ii < GI; ++ii) {
      const T wij = w[ii * ldw + j];
      const V ev = E ? splat<T>(e[ii * ldw + j]) : V{};
#pragma GCC unroll 16
      for (int tv = 0; tv < TV; ++tv) {
        const V z = signed_weight<T>(qv[ii][tv] - kv[tv], wij);
        if constexpr (E) {
          acc[ii][tv] += ev * kv[tv] + z;  // fused multiply-adds where there are
          y[ii][tv] = ev * qv[ii][tv] - z;
        } else {
          acc[ii][tv] += z;
          y[ii][tv] = z;
        }
      }
    }
#pragma GCC unroll 16
    for (int step = 1; step < GI; step *= 2)  // pairwise sum over the rows
#pragma GCC unroll 16
      for (int ii = 0; ii < GI; ii += 2 * step)
#pragma GCC unroll 16
        for (int tv = 0; tv < TV; ++tv) y[ii][tv] += y[ii + step][tv];
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) {
      T* at = gk + j * ldk + tv * W;
      store(at, E ? load<V>(at) + y[0][tv] : load<V>(at) - y[0][tv]);
    }
  }
#pragma GCC unroll 16
  for (int ii = 0; ii < GI; ++ii)
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) store(gq + ii * ldq + tv * W, acc[ii][tv]);
}

template <typename T, bool E>
void l1_grads(const T* w, const T* e, const T* q, const T* k, T* gq, T* gk, int64_t n,
              int64_t r, int64_t lk, int64_t d, int nthreads) {
  constexpr int W = VBYTES / sizeof(T);
  const int64_t dp = (d + W - 1) / W * W;  // t padded to whole vectors
  const bool padded = dp != d;
  const int64_t itiles = (r + GI - 1) / GI;
  // work items: (matrix, chunk of keys); each chunk owns its rows of gk, and writes its own
  // partial gq when a matrix is split into several chunks (few matrices, many threads)
  int64_t chunks = 1;
  if (n < nthreads) chunks = std::min<int64_t>((nthreads + n - 1) / n, (lk + 63) / 64);
  std::vector<T> parts(chunks > 1 ? n * chunks * r * d : 0, T(0));
  parallel(n * chunks, nthreads, r * lk * d / chunks, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<T> qbuf(GI * dp), gqbuf(GI * dp), wbuf(GI * GJ), ebuf(E ? GI * GJ : 0);
    std::vector<T> kbuf(padded ? lk * dp : 0), gkbuf(padded ? lk * dp : 0);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t m = item / chunks, c = item % chunks;
      const int64_t ja = lk * c / chunks, jb = lk * (c + 1) / chunks;
      const T* qm = q + m * r * d;
      const T* wm = w + m * r * lk;
      const T* em = E ? e + m * r * lk : nullptr;
      T* gqm = chunks > 1 ? parts.data() + item * r * d : gq + m * r * d;
      const T* km = k + m * lk * d;
      T* gkm = gk + m * lk * d;
      int64_t ldk = d;
      if (padded) {  // t padded with zeros: x = 0 and q_t = k_t = 0 there, which add nothing
        std::fill(kbuf.begin(), kbuf.end(), T(0));
        std::fill(gkbuf.begin(), gkbuf.end(), T(0));
        for (int64_t j = ja; j < jb; ++j) std::copy(km + j * d, km + (j + 1) * d, &kbuf[j * dp]);
        km = kbuf.data();
        ldk = dp;
      }
      T* gk_out = padded ? gkbuf.data() : gkm;
      for (int64_t it = 0; it < itiles; ++it) {
        const int64_t i0 = it * GI, in = std::min<int64_t>(GI, r - i0);
        std::fill(qbuf.begin(), qbuf.end(), T(0));
        std::fill(gqbuf.begin(), gqbuf.end(), T(0));
        for (int64_t ii = 0; ii < in; ++ii)
          std::copy(qm + (i0 + ii) * d, qm + (i0 + ii + 1) * d, &qbuf[ii * dp]);
        for (int64_t j0 = ja; j0 < jb; j0 += GJ) {
          const int64_t jn = std::min<int64_t>(GJ, jb - j0);
          const T* wt = wm + i0 * lk + j0;
          const T* et = E ? em + i0 * lk + j0 : nullptr;
          int64_t ldw = lk;
          if (in < GI) {  // last row tile: zero weights for the missing rows
            std::fill(wbuf.begin(), wbuf.end(), T(0));
            for (int64_t ii = 0; ii < in; ++ii)
              std::copy(wt + ii * lk, wt + ii * lk + jn, &wbuf[ii * GJ]);
            wt = wbuf.data();
            if constexpr (E) {
              std::fill(ebuf.begin(), ebuf.end(), T(0));
              for (int64_t ii = 0; ii < in; ++ii)
                std::copy(et + ii * lk, et + ii * lk + jn, &ebuf[ii * GJ]);
              et = ebuf.data();
            }
            ldw = GJ;
          }
          for (int64_t t0 = 0; t0 < dp;) {
            const T* qt = qbuf.data() + t0;
            const T* kt = km + j0 * ldk + t0;
            T* gqt = gqbuf.data() + t0;
            T* gkt = gk_out + j0 * ldk + t0;
            if (dp - t0 >= TV * W) {
              grad_tile<T, E, TV>(qt, dp, kt, ldk, wt, et, ldw, jn, gqt, gkt);
              t0 += TV * W;
            } else if (TV > 2 && dp - t0 >= 2 * W) {  // d = 32 in float32: one pass, not two
              grad_tile<T, E, 2>(qt, dp, kt, ldk, wt, et, ldw, jn, gqt, gkt);
              t0 += 2 * W;
            } else {
              grad_tile<T, E, 1>(qt, dp, kt, ldk, wt, et, ldw, jn, gqt, gkt);
              t0 += W;
            }
          }
        }
        for (int64_t ii = 0; ii < in; ++ii)
          std::copy(&gqbuf[ii * dp], &gqbuf[ii * dp] + d, gqm + (i0 + ii) * d);
      }
      if (padded)
        for (int64_t j = ja; j < jb; ++j)
          for (int64_t t = 0; t < d; ++t) gkm[j * d + t] += gkbuf[j * dp + t];
    }
  });
  if (chunks > 1)
    for (int64_t m = 0; m < n; ++m) {
      T* out = gq + m * r * d;
      std::fill(out, out + r * d, T(0));
      for (int64_t c = 0; c < chunks; ++c) {
        const T* part = parts.data() + (m * chunks + c) * r * d;
        for (int64_t x = 0; x < r * d; ++x) out[x] += part[x];
      }
    }
}

// -- Eq. 1-6 fused into the forward kernel's tiles (float32; attention/_coda_eq.h) ----------
// q.k and D (BACKWARD: and a.b, the recomputed dL/d(M with dropout)) of each tile of IT rows
// and JT keys into buffers of the tile, which stay in L1, then Eq. 1-6 (BACKWARD: its
// derivative) on the tile's rows by eq_span; short keys: on flat_sums' registers, the
// segments' inputs by masked loads and outputs by masked stores.  eq's arrays (mask, u, d_w;
// m, md, de, dn) are laid out (n, r, lk), its qk, dist and d_md unused: q.k, D and dL/dM
// never go to memory.  The same sums (l1_tile, dot_tile, flat_sums) and the same eq_values
// as l1_forward followed by eq_run, so the same results.
constexpr int64_t kEqWork = 64;  // element operations of Eq. 1-6 per (i, j), about

#if VBYTES == 64
// a float input of the segments' lanes (0 in lanes of no segment)
inline VF flat_load(const float* p, const FlatTile& ft, int ns, const int64_t (&at)[16]) {
  __m512 v = _mm512_setzero_ps();
  for (int s = 0; s < ns; ++s) v = _mm512_mask_loadu_ps(v, ft.mask[s], p + at[s]);
  return (VF)v;
}

inline VM flat_load_mask(const uint8_t* p, const FlatTile& ft, int ns,
                         const int64_t (&at)[16]) {
  __m128i v = _mm_setzero_si128();
  for (int s = 0; s < ns; ++s) v = _mm_mask_loadu_epi8(v, ft.mask[s], p + at[s]);
  return load<VM>(&v);
}

inline void flat_store(float* p, const FlatTile& ft, int ns, const int64_t (&at)[16], VF v) {
  for (int s = 0; s < ns; ++s) _mm512_mask_storeu_ps(p + at[s], ft.mask[s], (__m512)v);
}

template <int NS, int RT, bool BACKWARD>
__attribute__((always_inline)) inline void flat_eq_rows(const float* x, const float* a,
                                                       int64_t r, int64_t d, int64_t d2,
                                                       const float* kt, const float* bt,
                                                       const FlatTile& ft, int64_t row0,
                                                       int64_t lk, const Eq& eq) {
  const int ns = NS ? NS : ft.nseg;
  __m512 acc[RT], dt[RT], ab[RT] = {}, unused[RT];
  flat_sums<NS, RT, true>(x, r, d, kt, ft, row0, acc, dt);
  if (BACKWARD && a) flat_sums<NS, RT, false>(a, r, d2, bt, ft, row0, unused, ab);
#pragma GCC unroll 16
  for (int ii = 0; ii < RT; ++ii) {
    int64_t at[16];
    flat_offsets(ft, ns, r, row0 + ii, lk, at);
    EqIn in;
    in.qk = (VF)dt[ii];
    in.dist = (VF)acc[ii];
    in.valid = eq.mask ? eq_valid(flat_load_mask(eq.mask, ft, ns, at)) : VI{} - 1;
    in.dropout = eq.u != nullptr;
    in.keep = in.dropout ? eq_keep(flat_load(eq.u, ft, ns, at), eq.s) : VF{};
    in.d_md = BACKWARD && a ? (VF)ab[ii] : VF{};
    in.has_dw = eq.d_w != nullptr;
    in.d_w = in.has_dw ? flat_load(eq.d_w, ft, ns, at) : VF{};
    const EqOut o = eq_values<BACKWARD>(in, eq.s);
    if (eq.m) flat_store(eq.m, ft, ns, at, o.m);
    if (eq.md) flat_store(eq.md, ft, ns, at, o.md);
    if constexpr (BACKWARD) {
      flat_store(eq.de, ft, ns, at, o.de);
      flat_store(eq.dn, ft, ns, at, o.dn);
    }
  }
}
#endif

template <bool BACKWARD>
void fused_forward(const float* q, const float* k, const float* a, const float* b, const Eq& eq,
                   int64_t n, int64_t r, int64_t lk, int64_t d, int64_t d2, int nthreads) {
  const int64_t work = d + (a ? d2 : 0) + kEqWork;
#if VBYTES == 64
  if (flat_keys<float>(lk)) {
    flat_walk(k, a ? b : nullptr, n, r, lk, d, d2, work, nthreads,
              [&](auto ns, auto rt, int64_t row0, const FlatTile& ft, const float* kt,
                  const float* bt) {
                flat_eq_rows<decltype(ns)::value, decltype(rt)::value, BACKWARD>(
                    q, a, r, d, d2, kt, bt, ft, row0, lk, eq);
              });
    return;
  }
#endif
  constexpr int J = JV_QK, JT = J * WF;
  const int64_t itiles = (r + IT - 1) / IT, jtiles = (lk + JT - 1) / JT;
  parallel(n * jtiles, nthreads, IT * itiles * JT * work, kGrain,
           [&](int64_t begin, int64_t end) {
    std::vector<float> kbuf(d * JT), bbuf(a ? d2 * JT : 0), xbuf(IT * d), abuf(a ? IT * d2 : 0);
    std::vector<float> dist(IT * JT), dot(IT * JT), dot2(IT * JT);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t m = item / jtiles, j0 = (item % jtiles) * JT;
      const int64_t jn = std::min<int64_t>(JT, lk - j0);
      pack(k + m * lk * d, d, j0, jn, JT, kbuf);
      if (a) pack(b + m * lk * d2, d2, j0, jn, JT, bbuf);
      for (int64_t i0 = 0; i0 < r; i0 += IT) {
        const int64_t in = std::min<int64_t>(IT, r - i0);
        const float* x = q + (m * r + i0) * d;
        const float* xa = a ? a + (m * r + i0) * d2 : nullptr;
        if (in < IT) {  // the last rows, zero-padded
          std::fill(xbuf.begin(), xbuf.end(), 0.0f);
          std::copy(x, x + in * d, xbuf.data());
          x = xbuf.data();
          if (a) {
            std::fill(abuf.begin(), abuf.end(), 0.0f);
            std::copy(xa, xa + in * d2, abuf.data());
            xa = abuf.data();
          }
        }
        l1_tile<float, true>(x, d, kbuf.data(), JT, dist.data(), dot.data(), JT);
        if (a) dot_tile<float, J>(xa, d2, bbuf.data(), JT, dot2.data(), JT);
        for (int64_t ii = 0; ii < in; ++ii) {
          Eq row = eq.shifted((m * r + i0 + ii) * lk + j0);
          row.qk = dot.data() + ii * JT;
          row.dist = dist.data() + ii * JT;
          row.d_md = a ? dot2.data() + ii * JT : nullptr;
          eq_span<BACKWARD>(row, jn);
        }
      }
    }
  });
}

}  // namespace

extern "C" {

int coda_l1_vector_bytes() { return VBYTES; }

// D (n,r,lk); unless dot is null q.k (n,r,lk); unless a (n,r,d2) is null, a.b (n,r,lk) of
// b (n,lk,d2) in dot2
void coda_l1_forward_f32(const float* q, const float* k, float* out, float* dot, const float* a,
                         const float* b, float* dot2, int64_t n, int64_t r, int64_t lk,
                         int64_t d, int64_t d2, int nthreads) {
  if (dot)
    l1_forward<float, true>(q, k, out, dot, a, b, dot2, n, r, lk, d, d2, nthreads);
  else
    l1_forward<float, false>(q, k, out, dot, a, b, dot2, n, r, lk, d, d2, nthreads);
}

void coda_l1_forward_f64(const double* q, const double* k, double* out, double* dot,
                         const double* a, const double* b, double* dot2, int64_t n, int64_t r,
                         int64_t lk, int64_t d, int64_t d2, int nthreads) {
  if (dot)
    l1_forward<double, true>(q, k, out, dot, a, b, dot2, n, r, lk, d, d2, nthreads);
  else
    l1_forward<double, false>(q, k, out, dot, a, b, dot2, n, r, lk, d, d2, nthreads);
}

// gq (n,r,d) written, gk (n,lk,d) added to; e may be null (no q.k term)
void coda_l1_grads_f32(const float* w, const float* e, const float* q, const float* k,
                       float* gq, float* gk, int64_t n, int64_t r, int64_t lk, int64_t d,
                       int nthreads) {
  if (e)
    l1_grads<float, true>(w, e, q, k, gq, gk, n, r, lk, d, nthreads);
  else
    l1_grads<float, false>(w, e, q, k, gq, gk, n, r, lk, d, nthreads);
}

void coda_l1_grads_f64(const double* w, const double* e, const double* q, const double* k,
                       double* gq, double* gk, int64_t n, int64_t r, int64_t lk, int64_t d,
                       int nthreads) {
  if (e)
    l1_grads<double, true>(w, e, q, k, gq, gk, n, r, lk, d, nthreads);
  else
    l1_grads<double, false>(w, e, q, k, gq, gk, n, r, lk, d, nthreads);
}

// Eq. 1-6 forward: M (n,r,lk) written to m unless null, M with dropout to md (m and md may
// be one array when there is no dropout: u null); es = alpha s, ns = -beta s, gs = 2 for
// the scaled gate, else 1; p the dropout rate
void coda_eq_forward_f32(const float* qk, const float* dist, const uint8_t* mask,
                         const float* u, float* m, float* md, int64_t count, float es,
                         float ns, float gs, double p, int nthreads) {
  Eq a{qk, dist, u, nullptr, nullptr, mask, m, md, nullptr, nullptr, eq_scales(es, ns, gs, p)};
  eq_run<false>(a, count, nthreads);
}

// Eq. 1-6 backward: from the gradients of M with dropout (d_md) and of M (d_w), either
// null, M with dropout (md, unless null), dL/d(q.k) (de) and dL/dD (dn)
void coda_eq_backward_f32(const float* qk, const float* dist, const uint8_t* mask,
                          const float* u, const float* d_md, const float* d_w, float* md,
                          float* de, float* dn, int64_t count, float es, float ns, float gs,
                          double p, int nthreads) {
  Eq a{qk, dist, u, d_md, d_w, mask, nullptr, md, de, dn, eq_scales(es, ns, gs, p)};
  eq_run<true>(a, count, nthreads);
}

// coda_l1_forward_f32's q.k and D of q (n,r,d), k (n,lk,d) and coda_eq_forward_f32 on them
// in one pass over the tiles (mask and u (n,r,lk) as there; m, md (n,r,lk))
void coda_fused_forward_f32(const float* q, const float* k, const uint8_t* mask,
                            const float* u, float* m, float* md, int64_t n, int64_t r,
                            int64_t lk, int64_t d, float es, float ns, float gs, double p,
                            int nthreads) {
  Eq eq{nullptr, nullptr, u, nullptr, nullptr, mask, m, md, nullptr, nullptr,
        eq_scales(es, ns, gs, p)};
  fused_forward<false>(q, k, nullptr, nullptr, eq, n, r, lk, d, 0, nthreads);
}

// q.k, D and a.b (a (n,r,d2), b (n,lk,d2), or both null: no gradient of M with dropout)
// and coda_eq_backward_f32 on them (d_md = a.b) in one pass over the tiles
void coda_fused_backward_f32(const float* q, const float* k, const float* a, const float* b,
                             const uint8_t* mask, const float* u, const float* d_w, float* md,
                             float* de, float* dn, int64_t n, int64_t r, int64_t lk, int64_t d,
                             int64_t d2, float es, float ns, float gs, double p,
                             int nthreads) {
  Eq eq{nullptr, nullptr, u, nullptr, d_w, mask, nullptr, md, de, dn,
        eq_scales(es, ns, gs, p)};
  fused_forward<true>(q, k, a, b, eq, n, r, lk, d, d2, nthreads);
}

}  // extern "C"
