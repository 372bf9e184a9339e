// Additive (Bahdanau) attention's scores on CPU without the pairwise tensor
// (attention/_additive_ext.py builds and loads this file through attention/_native.py: a plain
// C interface, no torch header).  attention/additive.py's additive_scores forms
// tanh(wq_i + vk_j) as a (..., Lq, Lk, A) tensor in blocks of query rows and recomputes each
// block in the backward pass (activation checkpointing): at a classifier's size (IMDb: 16 x 4
// heads x 256 x 256 x 32) that is half a gigabyte per layer written and read a dozen times,
// and the step is bound by memory.  Here each tanh lives in a register only.
//
//   additive_forward_{f32,f64}    out[r, i, j] = sum_a u[r, a] tanh(wq[r, i, a] + vk[r, j, a])
//   additive_backward_{f32,f64}   from g = dL/dout: with t = tanh(wq_i + vk_j) per a,
//       dL/dwq[r, i, a] = u[r, a] sum_j g_ij (1 - t^2)
//       dL/dvk[r, j, a] = u[r, a] sum_i g_ij (1 - t^2)
//       dL/du[r, a]     = sum_i sum_j g_ij t
//   (the tanh recomputed, as the checkpointed blocks recompute it).
//
// Layout: wq (rows, lq, a), vk transposed to vkT (rows, a, lk), u (rows, a), out and g
// (rows, lq, lk), all contiguous; the caller expands broadcast batch dimensions (one u per head)
// and sums the gradients back.  Vectorised over keys j (vector lanes: 16 floats or 8 doubles
// with AVX-512), the last vector of a row partial (its missing lanes read as 0 and are never
// stored; their g is 0, so they add nothing); the tanh is _simd.h's.  Sums: dL/dwq over j in
// one vector then a fixed-order horizontal sum; dL/dvk over i in order; dL/du per (i, a) in a
// vector, then in double over i.  Each row r is one thread's (the forward splits query rows
// too), so results are the same whatever the number of threads.

#include "_simd.h"

namespace {

// work per thread at least (units of parallel(): pair-dimension operations)
constexpr int64_t kGrain = 1 << 16;

template <typename T>
void forward(const T* wq, const T* vkt, const T* u, T* out, int64_t rows, int64_t lq, int64_t lk,
             int64_t a, int nthreads) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  parallel(rows * lq, nthreads, lk * a, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / lq;
      const T* q = wq + item * a;
      const T* kt = vkt + r * a * lk;
      const T* ur = u + r * a;
      T* o = out + item * lk;
      for (int64_t j = 0; j < lk; j += W) {
        const int64_t n = std::min<int64_t>(W, lk - j);
        V acc = V{};
        for (int64_t c = 0; c < a; ++c)
          acc += ur[c] * vtanh<T>(q[c] + load_n(kt + c * lk + j, n));
        store_n(o + j, acc, n);
      }
    }
  });
}

template <typename T>
void backward(const T* wq, const T* vkt, const T* u, const T* g, T* dwq, T* dvkt, double* du,
              int64_t rows, int64_t lq, int64_t lk, int64_t a, int nthreads) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  parallel(rows, nthreads, 2 * lq * lk * a, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* kt = vkt + r * a * lk;
      const T* ur = u + r * a;
      T* dkt = dvkt + r * a * lk;  // zeroed by the caller, summed over i here
      double* dur = du + r * a;    // zeroed by the caller
      for (int64_t i = 0; i < lq; ++i) {
        const T* q = wq + (r * lq + i) * a;
        const T* gi = g + (r * lq + i) * lk;
        T* dq = dwq + (r * lq + i) * a;
        for (int64_t c = 0; c < a; ++c) {
          const T* kc = kt + c * lk;
          T* dkc = dkt + c * lk;
          V sum_s = V{}, sum_gt = V{};
          for (int64_t j = 0; j < lk; j += W) {
            const int64_t n = std::min<int64_t>(W, lk - j);
            const V t = vtanh<T>(q[c] + load_n(kc + j, n));
            const V gv = load_n(gi + j, n);
            const V s = gv * (T(1) - t * t);
            sum_s += s;
            sum_gt += gv * t;
            store_n(dkc + j, load_n(dkc + j, n) + ur[c] * s, n);
          }
          dq[c] = ur[c] * hsum<T>(sum_s);
          dur[c] += static_cast<double>(hsum<T>(sum_gt));
        }
      }
    }
  });
}

}  // namespace

#define ADDITIVE_ENTRY_POINTS(T, SUFFIX)                                                       \
  extern "C" void additive_forward_##SUFFIX(const T* wq, const T* vkt, const T* u, T* out,     \
                                            int64_t rows, int64_t lq, int64_t lk, int64_t a,   \
                                            int nthreads) {                                    \
    forward<T>(wq, vkt, u, out, rows, lq, lk, a, nthreads);                                    \
  }                                                                                            \
  extern "C" void additive_backward_##SUFFIX(const T* wq, const T* vkt, const T* u,            \
                                             const T* g, T* dwq, T* dvkt, double* du,          \
                                             int64_t rows, int64_t lq, int64_t lk, int64_t a,  \
                                             int nthreads) {                                   \
    backward<T>(wq, vkt, u, g, dwq, dvkt, du, rows, lq, lk, a, nthreads);                      \
  }

ADDITIVE_ENTRY_POINTS(float, f32)
ADDITIVE_ENTRY_POINTS(double, f64)
