// What the C++ kernels of attention/ share (attention/_coda_l1.cpp, attention/_window_rows.cpp,
// attention/_crf_chain.cpp, attention/_additive_pairs.cpp; attention/_native.py builds each
// with this header beside it and hashes both into the library's name): vectors of VBYTES bytes
// by the instruction set the file is compiled for (the loader picks -mavx512f..., -mavx2 -mfma
// or the compiler's default from torch's run-time CPU detection: one build per capability, no
// -march=native), their lanes, unaligned and partial loads and stores, a broadcast, a
// horizontal sum, a vector exp and tanh, and the split of work over threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif

namespace {

template <typename T>
struct Vec;

template <>
struct Vec<float> {
  typedef float V __attribute__((vector_size(VBYTES)));
  typedef int32_t S;  // the integer lane type
  typedef int32_t I __attribute__((vector_size(VBYTES)));
  typedef uint8_t M __attribute__((vector_size(VBYTES / 4)));  // one mask byte per lane
  static constexpr int W = VBYTES / 4;
  static constexpr int32_t kSign = INT32_MIN;
};

template <>
struct Vec<double> {
  typedef double V __attribute__((vector_size(VBYTES)));
  typedef int64_t S;
  typedef int64_t I __attribute__((vector_size(VBYTES)));
  typedef uint8_t M __attribute__((vector_size(VBYTES / 8)));
  static constexpr int W = VBYTES / 8;
  static constexpr int64_t kSign = INT64_MIN;
};

template <typename V>
__attribute__((always_inline)) inline V load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V>
__attribute__((always_inline)) inline void store(void* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

// s in every lane ((V{} + s would turn -0 into +0)
template <typename T>
__attribute__((always_inline)) inline typename Vec<T>::V splat(T s) {
  return s - typename Vec<T>::V{};
}

// -- partial vectors and horizontal sums -----------------------------------------------------
// The first n (1..W) lanes from p, the others 0; and their store.
template <typename T>
__attribute__((always_inline)) inline typename Vec<T>::V load_n(const T* p, int64_t n) {
  using V = typename Vec<T>::V;
  if (n == Vec<T>::W) return load<V>(p);
  V v = V{};
  std::memcpy(&v, p, n * sizeof(T));
  return v;
}

template <typename T>
__attribute__((always_inline)) inline void store_n(T* p, typename Vec<T>::V v, int64_t n) {
  if (n == Vec<T>::W)
    store(p, v);
  else
    std::memcpy(p, &v, n * sizeof(T));
}

// Constant index vectors (built at compile time: filled lane by lane at run time they cost a
// masked broadcast per lane): the sources of a shift by K lanes, up (K > 0) or down (K < 0),
// zeros shifted in (an index of W or more selects from the second operand of
// __builtin_shuffle, a zero vector).
template <typename T, int K, size_t... i>
constexpr typename Vec<T>::I shift_index(std::index_sequence<i...>) {
  constexpr int W = Vec<T>::W;
  return typename Vec<T>::I{static_cast<typename Vec<T>::S>(
      static_cast<int>(i) >= K ? static_cast<int>(i) - K : W + static_cast<int>(i))...};
}

template <typename T, int K>
__attribute__((always_inline)) inline typename Vec<T>::V shift_down(typename Vec<T>::V v) {
  constexpr typename Vec<T>::I index = shift_index<T, -K>(std::make_index_sequence<Vec<T>::W>());
  return __builtin_shuffle(v, typename Vec<T>::V{}, index);
}

// Horizontal sum: halves folded onto each other (log2(W) shuffles; a row's few reductions
// would otherwise cost more than its work on short rows, as in a classifier's); the same order
// of additions every time.
template <typename T, int K = Vec<T>::W / 2>
__attribute__((always_inline)) inline T hsum(typename Vec<T>::V v) {
  if constexpr (K == 0) {
    return v[0];
  } else {
    return hsum<T, K / 2>(v + shift_down<T, K>(v));
  }
}

// -- exp --------------------------------------------------------------------------------------
// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts, Cody and
// Waite, so that n * C1 is exact), exp(r) by a polynomial on |r| <= ln(2)/2, 2^n built in the
// exponent bits.  Below the smallest normal result the answer is 0 (the window's softmaxes
// take x <= 0 only, where that is at most 1.2e-38 (float) away); NaN stays NaN.
template <typename T>
struct Exp;

template <>
struct Exp<float> {
  using V = Vec<float>::V;
  using I = Vec<float>::I;
  __attribute__((always_inline)) static inline V eval(V x) {
    const V lo = splat<float>(-87.33654475f), hi = splat<float>(88.37626266f);
    const I under = x < lo;
    x = x > hi ? hi : x;
    x = x < lo ? lo : x;
    const V magic = splat<float>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    const V t = x * 1.44269504088896341f + magic;
    const V n = t - magic;
    const I ni = (I)t - (I)magic;
    V r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    // Cephes expf
    V p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const V scale = (V)((ni + 127) << 23);
    return under ? V{} : p * scale;
  }
};

template <>
struct Exp<double> {
  using V = Vec<double>::V;
  using I = Vec<double>::I;
  __attribute__((always_inline)) static inline V eval(V x) {
    const V lo = splat<double>(-708.3964185322641), hi = splat<double>(709.782712893384);
    const I under = x < lo;
    x = x > hi ? hi : x;
    x = x < lo ? lo : x;
    const V magic = splat<double>(6755399441055744.0);  // 1.5 * 2^52
    const V t = x * 1.4426950408889634074 + magic;
    const V n = t - magic;
    const I ni = (I)t - (I)magic;
    V r = x - n * 6.93145751953125e-1;
    r = r - n * 1.42860682030941723212e-6;
    // Taylor to degree 13: the remainder r^14/14! < 5e-18 for |r| <= ln(2)/2
    V p = splat<double>(1.0 / 6227020800.0);
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    const V scale = (V)((ni + 1023) << 52);
    return under ? V{} : p * scale;
  }
};

// -- tanh -------------------------------------------------------------------------------------
// tanh(x) = sign(x) (1 - 2 / (exp(2 |x|) + 1)), |x| capped at 20 (where tanh is 1 in double
// and float alike).  Its absolute error is that of the exp plus a rounding of 1 (a few ulp of
// 1: about 1e-7 in float, 2e-16 in double), so near 0 its relative error is larger than
// std::tanh's; the kernels use it inside sums of many terms, where the absolute error is what
// counts.  NaN stays NaN.
template <typename T>
__attribute__((always_inline)) inline typename Vec<T>::V vtanh(typename Vec<T>::V x) {
  using V = typename Vec<T>::V;
  using I = typename Vec<T>::I;
  const I sign = (I)x & Vec<T>::kSign;
  V ax = (V)((I)x & ~Vec<T>::kSign);
  ax = ax > T(20) ? splat<T>(T(20)) : ax;
  const V t = T(1) - T(2) / (Exp<T>::eval(ax + ax) + T(1));
  return (V)((I)t | sign);
}

// -- threads ------------------------------------------------------------------------------
// fn(begin, end) over [0, items) on up to nthreads threads: OpenMP when compiled with it (the
// loader tries -fopenmp first; the library then shares torch's libgomp, loaded under the same
// name, so its worker threads are torch's and nothing is oversubscribed), else std::thread.
// One thread per ``grain`` units of work at most (work_per_item per item), so none for small
// calls (a decoder step's rows: a parallel region costs microseconds).
template <typename F>
void parallel(int64_t items, int nthreads, int64_t work_per_item, int64_t grain, F&& fn) {
  int64_t useful = std::max<int64_t>(1, items * work_per_item / grain);
  int n = static_cast<int>(std::min<int64_t>({static_cast<int64_t>(std::max(1, nthreads)), items,
                                              useful}));
  if (n <= 1) {
    fn(int64_t(0), items);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(n)
  {
    const int64_t p = omp_get_thread_num(), count = omp_get_num_threads();
    fn(items * p / count, items * (p + 1) / count);
  }
#else
  std::vector<std::thread> pool;
  pool.reserve(n - 1);
  for (int p = 1; p < n; ++p)
    pool.emplace_back([&, p] { fn(items * p / n, items * (p + 1) / n); });
  fn(int64_t(0), items / n);
  for (auto& th : pool) th.join();
#endif
}

}  // namespace
