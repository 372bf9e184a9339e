// The differentiable window's element-wise work on CPU, one score row at a time
// (attention/_window_rows_ext.py builds and loads this file through attention/_native.py: a
// plain C interface, no torch header).  attention/_window_kernels.py forms a tile's score
// blocks with batched matrix products; this file turns each row of them (Lk keys, a few KiB:
// it stays in L1 while it is worked on) into the weights, and back into the score gradients,
// in a few passes over the row, where the expressions of _window_kernels.py (compiled by
// inductor) stream every (n, r, Lk) block through memory once per operation and cannot fuse
// the cumulative sums with anything.
//
//   window_rows_forward_{f32,f64}    A (and A times the dropout factors) of a tile
//   window_rows_backward_{f32,f64}   from dL/dA: dL/d sg, sl, sr (and sc), and A
//
// Per row, forward (Eq. 7-17, as aw_forward / mw_forward of _window_kernels.py):
//   phi_l = softmax(sl), phi_r = softmax(sr)            masked: masked entries and fully
//                                                       masked rows exactly 0 (Eq. 7)
//   L_b = cumsum(phi_l), L_a = L_b[-1] - L_b + phi_l    (R_b, R_a of phi_r alike; Eq. 8)
//   segments (Eq. 10-11): L_b, R_b taken at the end of each key's segment, L_a, R_a at its
//   start (start/end index arrays per key)
//   m = L_b R_a + R_b L_a                               (Eq. 9)
//   AW: A = softmax(sg + m sc)  (Eq. 14-17);  MW: A = softmax(sg) m  (Eq. 12)
// and backward the chain rule of aw_backward / mw_backward, with
//   dphi_l[i] = sum_{j >= start(i)} dm_j R_a[j] + sum_{j <= end(i)} dm_j R_b[j]
// (for tokens sum(d_b) + d_b + cumsum(d_a - d_b), one cumulative sum), then the softmax
// derivative p (dp - sum(dp p)).  The order of every operation follows those expressions,
// so results agree with them to rounding (the sums over a row are vector sums here).
//
// Arguments: one Arg (data pointer, matrix stride, row stride, in elements; the keys are
// contiguous) per slot of enum Slot, null data for an absent tensor: the tile's n matrices of
// r rows of lk keys may be views (the three score blocks of one stacked matmul, a tile of the
// returned weights) with no copy.  Outputs may share memory with the inputs they replace:
// forward, a and ad with any score block (a row's scores are all read before its weights are
// written); backward, a with da and dsg, dsl, dsr, dsc with sg, sl, sr, sc (each read before
// the output over it is written, key by key), so that a backward tile needs no memory
// beyond its score blocks.
//
// Vectorisation: GCC vector extensions of VBYTES bytes, set by the instruction set the file
// is compiled for (as attention/_coda_l1.cpp: one build per torch CPU capability); exp is
// _simd.h's vector polynomial (Cephes-style range reduction: float about 1 ulp, double a degree-13
// polynomial, about 1 ulp); cumulative sums are in-register prefix sums (log2(lanes)
// shift-and-adds) with a carry from vector to vector.
// Threads: OpenMP when built with it (sharing torch's libgomp), else std::thread; rows are
// split over nthreads (torch.get_num_threads()).

#include <limits>
#include <utility>

#include "_simd.h"

namespace {

// Constant index vectors (built at compile time, as _simd.h's shift_index): iota.
template <typename T, size_t... i>
constexpr typename Vec<T>::I iota(std::index_sequence<i...>) {
  return typename Vec<T>::I{static_cast<typename Vec<T>::S>(i)...};
}

// The lanes that take part: the first n (the last vector of a row may be partial) and, with a
// mask, those it keeps (all -1 or 0 per lane).
template <typename T>
__attribute__((always_inline)) inline typename Vec<T>::I lanes(const uint8_t* mask, int64_t n) {
  using I = typename Vec<T>::I;
  using M = typename Vec<T>::M;
  if (mask) {
    M b = M{};
    std::memcpy(&b, mask, n);
    return __builtin_convertvector(b, I) != 0;
  }
  constexpr I index = iota<T>(std::make_index_sequence<Vec<T>::W>());
  return index < static_cast<typename Vec<T>::S>(n);
}

template <typename T>
__attribute__((always_inline)) inline typename Vec<T>::V vmax(typename Vec<T>::V a,
                                                              typename Vec<T>::V b) {
  return a > b ? a : b;
}

// Horizontal max: halves folded onto each other (as _simd.h's hsum)
template <typename T, int K = Vec<T>::W / 2>
__attribute__((always_inline)) inline T hmax(typename Vec<T>::V v) {
  if constexpr (K == 0) {
    return v[0];
  } else {
    return hmax<T, K / 2>(vmax<T>(v, shift_down<T, K>(v)));
  }
}

// Inclusive prefix sum within a vector: log2(W) steps of "add the vector shifted up by k lanes
// (zeros shifted in)", one permute each.
template <typename T, int K>
__attribute__((always_inline)) inline typename Vec<T>::V prefix_from(typename Vec<T>::V v) {
  if constexpr (K >= Vec<T>::W) {
    return v;
  } else {
    constexpr typename Vec<T>::I index = shift_index<T, K>(std::make_index_sequence<Vec<T>::W>());
    return prefix_from<T, 2 * K>(v + __builtin_shuffle(v, typename Vec<T>::V{}, index));
  }
}

template <typename T>
__attribute__((always_inline)) inline typename Vec<T>::V prefix(typename Vec<T>::V v) {
  return prefix_from<T, 1>(v);
}

// the last lane in every lane
template <typename T>
__attribute__((always_inline)) inline typename Vec<T>::V last(typename Vec<T>::V v) {
  using I = typename Vec<T>::I;
  return __builtin_shuffle(v, I{} + (Vec<T>::W - 1));
}

// -- arguments --------------------------------------------------------------------------------
struct Arg {
  void* data;
  int64_t matrix_stride, row_stride;  // in elements
};

enum Slot { SG, SL, SR, SC, MASK, KEEP, DKEEP, DA, A, AD, DSG, DSL, DSR, DSC, SLOTS };

template <typename T>
struct RowPtr {  // the row (i, q) of a slot, or null
  static T* at(const Arg& a, int64_t i, int64_t q) {
    return a.data ? static_cast<T*>(a.data) + i * a.matrix_stride + q * a.row_stride : nullptr;
  }
};

// -- one row ----------------------------------------------------------------------------------
// A thread's buffers (the padded row, aligned to vectors) and the passes over a row, for
// tokens or (Segments) for segments.  The lanes past lk in the buffers are 0 where they enter
// a sum and finite elsewhere, so every pass works on whole vectors and only the reads and
// writes of the tile's rows handle the last partial vector.  Few buffers (8 for tokens: 16 KiB
// at Lk = 512) beside the row's own scores, so that a row's work stays in L1: the factors of
// Eq. 9 and m are recomputed from the cumulative sums where they are needed (a few
// operations) instead of stored, and passes are merged where one's result is not needed in
// full before the next starts (the sums of the chain rule ride along the passes before them).
template <typename T, bool Segments>
class Row {
  using V = typename Vec<T>::V;
  using I = typename Vec<T>::I;
  static constexpr int W = Vec<T>::W;
  static constexpr T kInf = std::numeric_limits<T>::infinity();

 public:
  Row(int64_t lk, const int64_t* start, const int64_t* end)
      : lk_(lk), lkp_((lk + W - 1) / W * W), start_(start), end_(end),
        storage_(kBuffers * lkp_ + W) {
    T* base = storage_.data();
    base += (W - (reinterpret_cast<uintptr_t>(base) / sizeof(T)) % W) % W;  // align
    T** buffers[kBuffers] = {&pl_, &pr_, &cl_, &cr_, &p_, &dm_, &gl_, &gr_};
    for (int b = 0; b < kBuffers; ++b) *buffers[b] = base + b * lkp_;
    if constexpr (Segments) {
      segment_.resize(kSegmentBuffers * lkp_ + W);
      base = segment_.data();
      base += (W - (reinterpret_cast<uintptr_t>(base) / sizeof(T)) % W) % W;
      T** more[kSegmentBuffers] = {&lb_, &la_, &rb_, &ra_, &t0_, &t1_, &t2_, &t3_};
      for (int b = 0; b < kSegmentBuffers; ++b) *more[b] = base + b * lkp_;
    }
  }

  // phi_l, phi_r (Eq. 7) and their cumulative sums (for segments also the four factors of
  // Eq. 10-11, gathered); false (nothing computed) if every key is masked
  bool window(const T* sl, const T* sr, const uint8_t* mask) {
    V top_l = splat<T>(-kInf), top_r = top_l;
    for (int64_t j = 0; j < lk_; j += W) {
      const int64_t n = std::min<int64_t>(W, lk_ - j);
      const I ok = lanes<T>(mask ? mask + j : nullptr, n);
      top_l = ok ? vmax<T>(top_l, load_n(sl + j, n)) : top_l;
      top_r = ok ? vmax<T>(top_r, load_n(sr + j, n)) : top_r;
    }
    const T tl = hmax<T>(top_l), tr = hmax<T>(top_r);
    if (tl == -kInf) return false;
    V sum_l = V{}, sum_r = V{};
    for (int64_t j = 0; j < lk_; j += W) {  // (masked lanes may hold any finite score)
      const int64_t n = std::min<int64_t>(W, lk_ - j);
      const I ok = lanes<T>(mask ? mask + j : nullptr, n);
      const V el = ok ? Exp<T>::eval(load_n(sl + j, n) - tl) : V{};
      const V er = ok ? Exp<T>::eval(load_n(sr + j, n) - tr) : V{};
      store(pl_ + j, el);
      store(pr_ + j, er);
      sum_l += el;
      sum_r += er;
    }
    const T il = T(1) / hsum<T>(sum_l), ir = T(1) / hsum<T>(sum_r);
    V carry_l = V{}, carry_r = V{};
    for (int64_t j = 0; j < lk_; j += W) {  // the softmaxes and their cumulative sums
      const V vl = load<V>(pl_ + j) * il, vr = load<V>(pr_ + j) * ir;
      store(pl_ + j, vl);
      store(pr_ + j, vr);
      const V cl = prefix<T>(vl) + carry_l, cr = prefix<T>(vr) + carry_r;
      store(cl_ + j, cl);
      store(cr_ + j, cr);
      carry_l = last<T>(cl);
      carry_r = last<T>(cr);
    }
    total_l_ = cl_[lk_ - 1];
    total_r_ = cr_[lk_ - 1];
    if constexpr (Segments) {  // L_b, R_b at the end of the key's segment, L_a, R_a at its start
      for (int64_t j = 0; j < lk_; ++j) {
        const int64_t s = start_[j], e = end_[j];
        lb_[j] = cl_[e];
        rb_[j] = cr_[e];
        la_[j] = (total_l_ - cl_[s]) + pl_[s];
        ra_[j] = (total_r_ - cr_[s]) + pr_[s];
      }
      for (int64_t j = lk_; j < lkp_; ++j) lb_[j] = rb_[j] = la_[j] = ra_[j] = T(0);
    }
    return true;
  }

  // The final softmax's numerators, of sg (MW) or sg + m sc (AW, Eq. 14-17), into p_ and the
  // reciprocal of their sum into inv_ (the weights are p_ inv_: no pass to normalise them).
  // With da (the backward pass): also sum_j g_j A_j (AW) or sum_j g_j m_j p_j (MW) into dot_,
  // g = da (times dkeep unless null), the softmax derivative's sum.
  void weights(bool aw, const T* sg, const T* sc, const uint8_t* mask, const T* da = nullptr,
               const T* dkeep = nullptr) {
    V top = splat<T>(-kInf);
    for (int64_t j = 0; j < lk_; j += W) {
      const int64_t n = std::min<int64_t>(W, lk_ - j);
      const I ok = lanes<T>(mask ? mask + j : nullptr, n);
      V z = load_n(sg + j, n);
      if (aw) z = z + window_at(j) * load_n(sc + j, n);
      z = ok ? z : splat<T>(-kInf);
      store(p_ + j, z);
      top = vmax<T>(top, z);
    }
    const T t = hmax<T>(top);
    V sum = V{}, dot = V{};
    for (int64_t j = 0; j < lk_; j += W) {  // exp(-inf) = 0: the masked lanes
      const V e = Exp<T>::eval(load<V>(p_ + j) - t);
      store(p_ + j, e);
      sum += e;
      if (da) {
        const int64_t n = std::min<int64_t>(W, lk_ - j);
        V g = load_n(da + j, n);
        if (dkeep) g = g * load_n(dkeep + j, n);
        dot += aw ? g * e : g * window_at(j) * e;
      }
    }
    inv_ = T(1) / hsum<T>(sum);
    dot_ = hsum<T>(dot) * inv_;
  }

  // A (AW: the softmax; MW: softmax(sg) m, Eq. 12) into a and A keep into ad (each unless null)
  void write_weights(bool aw, const T* keep, T* a, T* ad) {
    for (int64_t j = 0; j < lk_; j += W) {
      const int64_t n = std::min<int64_t>(W, lk_ - j);
      V w = load<V>(p_ + j) * inv_;
      if (!aw) w = w * window_at(j);
      if (a) store_n(a + j, w, n);
      if (ad) store_n(ad + j, w * load_n(keep + j, n), n);
    }
  }

  // The chain rule from dL/dA (da, times dkeep unless null; dot_ from weights()) to the
  // global (and local) scores, into dsg (dsc), and to m, into dm_; A (times keep unless null)
  // into a_out (unless null).  AW: dz = A (g - sum(g A)), dsg = dz, dsc = dz m, dm = dz sc;
  // MW: dsg = p (g m - sum(g m p)), dm = g p, A = p m.  Also the sums of d_b for the
  // boundaries' tokens: sum_j dm_j R_a[j] and sum_j dm_j L_a[j].
  void grad(bool aw, const T* sc, const T* da, const T* dkeep, const T* keep, T* a_out, T* dsg,
            T* dsc) {
    const T s = dot_;
    V sum_l = V{}, sum_r = V{};
    for (int64_t j = 0; j < lk_; j += W) {
      const int64_t n = std::min<int64_t>(W, lk_ - j);
      V g = load_n(da + j, n);
      if (dkeep) g = g * load_n(dkeep + j, n);
      const Factors f = factors(j);
      const V m = f.lb * f.ra + f.rb * f.la;
      const V p = load<V>(p_ + j) * inv_;
      V a, dm;
      if (aw) {
        const V dz = p * (g - s);
        dm = dz * load_n(sc + j, n);
        store_n(dsg + j, dz, n);
        store_n(dsc + j, dz * m, n);
        a = p;
      } else {
        dm = g * p;
        store_n(dsg + j, p * (g * m - s), n);
        a = p * m;
      }
      store(dm_ + j, dm);  // (0 past lk: p is)
      sum_l += dm * f.ra;
      sum_r += dm * f.la;
      if (a_out) store_n(a_out + j, keep ? a * load_n(keep + j, n) : a, n);
    }
    sum_l_ = hsum<T>(sum_l);
    sum_r_ = hsum<T>(sum_r);
  }

  // From dm_ (dL/dm per key) to dL/d left and right scores: the derivative of Eq. 9-11, then
  // of the boundary softmaxes
  void boundary_grad(T* dsl, T* dsr) {
    V dot_l = V{}, dot_r = V{};
    if constexpr (!Segments) {  // tokens: dphi = sum(d_b) + d_b + cumsum(d_a - d_b)
      V carry_l = V{}, carry_r = V{};
      for (int64_t j = 0; j < lk_; j += W) {
        const V dm = load<V>(dm_ + j);
        const Factors f = factors(j);
        // phi_l: d_b = dm R_a, d_a = dm R_b;  phi_r: d_b = dm L_a, d_a = dm L_b
        const V before_l = dm * f.ra, after_l = dm * f.rb;
        const V before_r = dm * f.la, after_r = dm * f.lb;
        const V cum_l = prefix<T>(after_l - before_l) + carry_l;
        const V cum_r = prefix<T>(after_r - before_r) + carry_r;
        carry_l = last<T>(cum_l);
        carry_r = last<T>(cum_r);
        const V gl = (sum_l_ + before_l) + cum_l, gr = (sum_r_ + before_r) + cum_r;
        store(gl_ + j, gl);
        store(gr_ + j, gr);
        dot_l += gl * load<V>(pl_ + j);
        dot_r += gr * load<V>(pr_ + j);
      }
    } else {
      // segments: dphi[i] = reverse(d_b)[start(i)] + cumsum(d_a)[end(i)], with reverse(x)_i =
      // sum_{j >= i} x_j = cumsum(x)[-1] - cumsum(x)_i + x_i
      V carry[4] = {V{}, V{}, V{}, V{}};
      T* sums[4] = {t0_, t1_, t2_, t3_};  // cumsum of d_b, d_a of phi_l; of d_b, d_a of phi_r
      for (int64_t j = 0; j < lk_; j += W) {
        const V dm = load<V>(dm_ + j);
        const Factors f = factors(j);
        const V x[4] = {dm * f.ra, dm * f.rb, dm * f.la, dm * f.lb};
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
          const V c = prefix<T>(x[s]) + carry[s];
          store(sums[s] + j, c);
          carry[s] = last<T>(c);
        }
      }
      const T last_l = t0_[lk_ - 1], last_r = t2_[lk_ - 1];
      for (int64_t j = 0; j < lk_; j += W) {  // the reverse sums, in place
        const V dm = load<V>(dm_ + j);
        store(t0_ + j, (last_l - load<V>(t0_ + j)) + dm * load<V>(ra_ + j));
        store(t2_ + j, (last_r - load<V>(t2_ + j)) + dm * load<V>(la_ + j));
      }
      for (int64_t i = 0; i < lk_; ++i) {
        const int64_t s = start_[i], e = end_[i];
        gl_[i] = t0_[s] + t1_[e];
        gr_[i] = t2_[s] + t3_[e];
      }
      for (int64_t j = lk_; j < lkp_; ++j) gl_[j] = gr_[j] = T(0);
      for (int64_t j = 0; j < lk_; j += W) {
        dot_l += load<V>(gl_ + j) * load<V>(pl_ + j);
        dot_r += load<V>(gr_ + j) * load<V>(pr_ + j);
      }
    }
    // the boundary softmaxes: dsl = phi_l (dphi_l - sum(dphi_l phi_l)), dsr alike
    const T sl = hsum<T>(dot_l), sr = hsum<T>(dot_r);
    for (int64_t j = 0; j < lk_; j += W) {
      const int64_t n = std::min<int64_t>(W, lk_ - j);
      store_n(dsl + j, load<V>(pl_ + j) * (load<V>(gl_ + j) - sl), n);
      store_n(dsr + j, load<V>(pr_ + j) * (load<V>(gr_ + j) - sr), n);
    }
  }

 private:
  static constexpr int kBuffers = 8, kSegmentBuffers = 8;

  struct Factors {
    V lb, la, rb, ra;
  };

  // L_b, L_a, R_b, R_a (Eq. 9) at keys j..j+W: for tokens from the cumulative sums,
  // L_a = L_b[-1] - L_b + phi_l (R_a alike), as attention.window computes them
  __attribute__((always_inline)) Factors factors(int64_t j) const {
    if constexpr (Segments) {
      return {load<V>(lb_ + j), load<V>(la_ + j), load<V>(rb_ + j), load<V>(ra_ + j)};
    } else {
      const V cl = load<V>(cl_ + j), cr = load<V>(cr_ + j);
      return {cl, (total_l_ - cl) + load<V>(pl_ + j), cr, (total_r_ - cr) + load<V>(pr_ + j)};
    }
  }

  // m = L_b R_a + R_b L_a (Eq. 9) at keys j..j+W
  __attribute__((always_inline)) V window_at(int64_t j) const {
    const Factors f = factors(j);
    return f.lb * f.ra + f.rb * f.la;
  }

  int64_t lk_, lkp_;
  const int64_t *start_, *end_;
  std::vector<T> storage_, segment_;
  T *pl_, *pr_, *cl_, *cr_, *p_, *dm_, *gl_, *gr_;
  T *lb_ = nullptr, *la_ = nullptr, *rb_ = nullptr, *ra_ = nullptr;
  T *t0_ = nullptr, *t1_ = nullptr, *t2_ = nullptr, *t3_ = nullptr;
  T total_l_ = T(0), total_r_ = T(0), inv_ = T(1), dot_ = T(0), sum_l_ = T(0), sum_r_ = T(0);
};

template <typename T>
void zero_row(T* p, int64_t lk) {
  if (p) std::fill(p, p + lk, T(0));
}

// the work per key of a forward row, in the units of parallel() (the backward does about twice
// as much), and the least work worth a thread: 2^16 units are some 1000 keys, a few
// microseconds of one core
constexpr int64_t kWorkPerKey = 64;
constexpr int64_t kGrain = 1 << 16;

template <typename T, bool Segments>
void rows_forward(const Arg* args, const int64_t* start, const int64_t* end, int64_t n,
                  int64_t r, int64_t lk, int nthreads) {
  const bool aw = args[SC].data != nullptr;
  parallel(n * r, nthreads, lk * kWorkPerKey, kGrain, [&](int64_t begin, int64_t stop) {
    Row<T, Segments> row(lk, start, end);
    for (int64_t item = begin; item < stop; ++item) {
      const int64_t i = item / r, q = item % r;
      auto in = [&](Slot s) { return RowPtr<const T>::at(args[s], i, q); };
      auto out = [&](Slot s) { return RowPtr<T>::at(args[s], i, q); };
      const uint8_t* mask = RowPtr<const uint8_t>::at(args[MASK], i, q);
      T *a = out(A), *ad = out(AD);
      if (!row.window(in(SL), in(SR), mask)) {  // every key masked: A = 0
        zero_row(a, lk);
        zero_row(ad, lk);
        continue;
      }
      row.weights(aw, in(SG), in(SC), mask);
      row.write_weights(aw, in(KEEP), a, ad);
    }
  });
}

template <typename T, bool Segments>
void rows_backward(const Arg* args, const int64_t* start, const int64_t* end, int64_t n,
                   int64_t r, int64_t lk, int nthreads) {
  const bool aw = args[SC].data != nullptr;
  parallel(n * r, nthreads, 2 * lk * kWorkPerKey, kGrain, [&](int64_t begin, int64_t stop) {
    Row<T, Segments> row(lk, start, end);
    for (int64_t item = begin; item < stop; ++item) {
      const int64_t i = item / r, q = item % r;
      auto in = [&](Slot s) { return RowPtr<const T>::at(args[s], i, q); };
      auto out = [&](Slot s) { return RowPtr<T>::at(args[s], i, q); };
      const uint8_t* mask = RowPtr<const uint8_t>::at(args[MASK], i, q);
      if (!row.window(in(SL), in(SR), mask)) {  // every key masked: A and every gradient 0
        for (Slot s : {A, DSG, DSL, DSR, DSC}) zero_row(out(s), lk);
        continue;
      }
      row.weights(aw, in(SG), in(SC), mask, in(DA), in(DKEEP));
      row.grad(aw, in(SC), in(DA), in(DKEEP), in(KEEP), out(A), out(DSG), out(DSC));
      row.boundary_grad(out(DSL), out(DSR));
    }
  });
}

template <typename T>
void forward(const Arg* args, const int64_t* start, const int64_t* end, int64_t n, int64_t r,
             int64_t lk, int nthreads) {
  if (start)
    rows_forward<T, true>(args, start, end, n, r, lk, nthreads);
  else
    rows_forward<T, false>(args, start, end, n, r, lk, nthreads);
}

template <typename T>
void backward(const Arg* args, const int64_t* start, const int64_t* end, int64_t n, int64_t r,
              int64_t lk, int nthreads) {
  if (start)
    rows_backward<T, true>(args, start, end, n, r, lk, nthreads);
  else
    rows_backward<T, false>(args, start, end, n, r, lk, nthreads);
}

}  // namespace

extern "C" {

int window_rows_vector_bytes() { return VBYTES; }

// A (n,r,lk) of the tile: AW when args[SC] is given, else MW; A into args[A] and A times
// args[KEEP] into args[AD] (each unless null).  start/end: null (tokens) or the first and last
// key of each key's segment (lk each).
void window_rows_forward_f32(const Arg* args, const int64_t* start, const int64_t* end,
                             int64_t n, int64_t r, int64_t lk, int nthreads) {
  forward<float>(args, start, end, n, r, lk, nthreads);
}

void window_rows_forward_f64(const Arg* args, const int64_t* start, const int64_t* end,
                             int64_t n, int64_t r, int64_t lk, int nthreads) {
  forward<double>(args, start, end, n, r, lk, nthreads);
}

// From dL/dA (args[DA], times args[DKEEP] unless null): dL/d sg, sl, sr (and sc for AW) into
// args[DSG], [DSL], [DSR], [DSC], and A (times args[KEEP] unless null) into args[A]
void window_rows_backward_f32(const Arg* args, const int64_t* start, const int64_t* end,
                              int64_t n, int64_t r, int64_t lk, int nthreads) {
  backward<float>(args, start, end, n, r, lk, nthreads);
}

void window_rows_backward_f64(const Arg* args, const int64_t* start, const int64_t* end,
                              int64_t n, int64_t r, int64_t lk, int nthreads) {
  backward<double>(args, start, end, n, r, lk, nthreads);
}

}  // extern "C"
