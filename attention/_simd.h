// What the C++ kernels of attention/ share (attention/_coda_l1.cpp, attention/_window_rows.cpp,
// attention/_crf_chain.cpp; attention/_native.py builds each with this header beside it and
// hashes both into the library's name): vectors of VBYTES bytes by the instruction set the
// file is compiled for (the loader picks -mavx512f..., -mavx2 -mfma or the compiler's default
// from torch's run-time CPU detection: one build per capability, no -march=native), their
// lanes, unaligned loads and stores, a broadcast, and the split of work over threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
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
