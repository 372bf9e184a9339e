// Structured (segmentation) attention's linear-chain CRF on CPU, a chain per vector lane
// (attention/_crf_chain_ext.py builds and loads this file through attention/_native.py: a
// plain C interface, no torch header).  attention/structured.py's forward_backward runs the
// same recursions in log space as a Python loop over positions, vectorised over chains, each
// step a handful of small tensor operations that autograd records; with a score row of
// hundreds of keys (IMDb: 256) that loop, and autograd's replay of it, is most of a training
// step.  Here a block of chains is worked through in a few passes while it is in cache.
//
//   crf_chain_forward_{f32,f64}    the marginals p(z_j = 1), or the attention weights
//                                  lam * p / sum(p) over the chain's real positions
//   crf_chain_backward_{f32,f64}   from dL/d those: dL/dtheta, and dL/dW summed over chains
//
// The chain (structured.py's docstring): binary z_j over the real (mask true) positions j,
//   log phi(z) = start[z_first] + sum_j theta_j z_j + sum W[z_j, z_next] + end[z_last],
// start[c] = mean_a W[a, c], end[c] = mean_b W[c, b].
//
// Forward, per chain, in double whatever T (scaled forward-backward, as for an HMM): with
// m_j = max(0, theta_j) and u_j = (exp(-m_j), exp(theta_j - m_j)) (the unary potentials times
// exp(-m_j), a factor common to both states, so every probability is unchanged and neither
// entry exceeds 1), E = exp(W), s = exp(start), e = exp(end):
//   alpha_j = (alpha_prev E) * u_j / c_j          (alpha_first = s * u_first / c_first)
//   beta_j = E (u_next * beta_next) / r_j         (beta_last = e / r_last)
// each normalised to sum 1 by c_j, r_j, and p_j = alpha_j[1] beta_j[1] / N_j with
// N_j = alpha_j . beta_j.  Masked positions are skipped (out of the chain).
//
// Backward: for a loss L(p) with g = dL/dp, dL/dtheta_k = sum_j g_j Cov(z_j, z_k) =
// E[z_k G] - p_k E[G], G = sum_j g_j z_j, and dL/dW_ab = Cov(n_ab, G) + Cov([z_first = b], G)/2
// + Cov([z_last = a], G)/2 (n_ab: the number of a -> b transitions; the halves: start and end
// are means over W's other index).  The expectations of products with G come from the
// first-order expectation semiring (Li and Eisner 2009): accumulators A_j (paths up to j,
// weighted by their part of G) and B_j (after j) run beside alpha and beta with the same
// normalisers,
//   A_j = (A_prev E) * u_j / c_j + alpha_j * g_j [state 1]
//   B_j = E (u_next * (B_next + beta_next * g_next [state 1])) / r_j
// so E[z_k G] = (A_k[1] beta_k[1] + alpha_k[1] B_k[1]) / N_k; the transition statistics are
// sums over neighbouring real positions of the same products (Block::backward).  For the
// weights w = lam p / S (S = sum of p over the chain) the chain rule first turns dL/dw into
// dL/dp = (lam / S) (dL/dw - sum_k w_k dL/dw_k / lam).  No logarithm anywhere: one exp per
// position.
//
// Vectorisation: the chains are independent, so each vector lane carries one (GCC vector
// extensions of VBYTES bytes, double lanes: 8 with AVX-512, 4 with AVX2): a block of lanes
// walks its chains' positions together, a masked position leaving its lane's state as it is
// (a blend), so every recursion step is a handful of vector operations for all the lanes, and
// the exp is _simd.h's vector polynomial.  Per block, four passes over the positions: alpha
// (forward), beta and p (backward); for the backward pass also B (backward), then A with
// dL/dtheta and the transition statistics (forward).
//
// Range: p_j is formed as a product of normalised factors, so it underflows only below
// about 1e-308 (the vector exp gives 0 below exp(-708)); a chain whose every p_j is below
// 1e-290 (scores around -670 and lower, where S itself is not representable) is reported (the
// return value counts such chains) and the caller uses the log-space recursion of
// structured.py instead.
//
// Arguments: theta (rows, n) contiguous, mask (rows, n) bool or null (all real), w: W as
// 4 values (row major), out (rows, n); backward: grad (rows, n), dtheta (rows, n), dw: 4
// doubles (written, summed over the lanes of each block, then over the blocks in order: the
// same sum whatever the number of threads).  Threads: OpenMP when built with it (sharing
// torch's libgomp), else std::thread; chains are split over nthreads.

#include <cmath>
#include <mutex>

#include "_simd.h"

namespace {

using V = Vec<double>::V;
using I = Vec<double>::I;
constexpr int W = Vec<double>::W;
constexpr double kTiny = 1e-290;

struct Potentials {
  double e00, e01, e10, e11, s0, s1, f0, f1;  // E = exp(W), s = exp(start), f = exp(end)
  explicit Potentials(const double* w) {
    e00 = std::exp(w[0]), e01 = std::exp(w[1]), e10 = std::exp(w[2]), e11 = std::exp(w[3]);
    s0 = std::exp(0.5 * (w[0] + w[2])), s1 = std::exp(0.5 * (w[1] + w[3]));
    f0 = std::exp(0.5 * (w[0] + w[1])), f1 = std::exp(0.5 * (w[2] + w[3]));
  }
};

__attribute__((always_inline)) inline V pick(I m, V yes, V no) { return m ? yes : no; }

inline double lane_sum(V v) {  // in lane order
  double out = 0;
  for (int l = 0; l < W; ++l) out += v[l];
  return out;
}

// One block of up to W chains (rows first .. first + lanes - 1): per position j, the lanes'
// values (lanes beyond `lanes` are empty chains)
template <typename T>
struct Block {
  const T* theta;
  const bool* mask;
  int64_t n;
  const Potentials& w;
  // ic, ir, in: the reciprocals of the normalisers c, r and of N = alpha . beta
  std::vector<V> u0, u1, a0, a1, ic, b0, b1, ir, in, p, fb0, fb1, rg;
  std::vector<I> real;
  int64_t first = 0;
  int lanes = 0;
  V total{};  // S: the sum of p over each chain
  I any{};    // the chain has a real position

  Block(const T* theta_, const bool* mask_, int64_t n_, const Potentials& w_)
      : theta(theta_), mask(mask_), n(n_), w(w_), u0(n_), u1(n_), a0(n_), a1(n_), ic(n_),
        b0(n_), b1(n_), ir(n_), in(n_), p(n_), fb0(n_), fb1(n_), rg(n_), real(n_) {}

  // theta at position j of each lane (0 where masked) and the lanes' real mask
  V gather(const T* x, int64_t j, I& rl) const {
    alignas(64) double v[W];
    alignas(64) int64_t m[W];
    for (int l = 0; l < W; ++l) {
      const int64_t at = (first + l) * n + j;
      const bool ok = l < lanes && (!mask || mask[at]);
      m[l] = -static_cast<int64_t>(ok);
      v[l] = ok ? static_cast<double>(x[at]) : 0.0;
    }
    rl = load<I>(m);
    return load<V>(v);
  }

  void scatter(T* out, int64_t j, V v) const {
    for (int l = 0; l < lanes; ++l) out[(first + l) * n + j] = static_cast<T>(v[l]);
  }

  // alpha forward, beta and p backward, S
  void forward_backward(int64_t first_, int lanes_) {
    first = first_, lanes = lanes_;
    I started{};
    V pa0{}, pa1{};
    for (int64_t j = 0; j < n; ++j) {
      I rl;
      const V t = gather(theta, j, rl);
      const V x = Exp<double>::eval(pick(t > 0, -t, t));  // exp(-|t|)
      const V one = splat<double>(1.0);
      const V uu0 = pick(t > 0, x, one), uu1 = pick(t > 0, one, x);
      const V q0 = pick(started, pa0 * w.e00 + pa1 * w.e10, splat<double>(w.s0));
      const V q1 = pick(started, pa0 * w.e01 + pa1 * w.e11, splat<double>(w.s1));
      const V x0 = q0 * uu0, x1 = q1 * uu1, icj = one / (x0 + x1);
      pa0 = pick(rl, x0 * icj, pa0), pa1 = pick(rl, x1 * icj, pa1);
      u0[j] = uu0, u1[j] = uu1, a0[j] = pa0, a1[j] = pa1, ic[j] = pick(rl, icj, one);
      real[j] = rl;
      started |= rl;
    }
    any = started;
    started = I{};
    V v0{}, v1{};
    total = V{};
    for (int64_t j = n - 1; j >= 0; --j) {
      const I rl = real[j];
      const V y0 = pick(started, w.e00 * v0 + w.e01 * v1, splat<double>(w.f0));
      const V y1 = pick(started, w.e10 * v0 + w.e11 * v1, splat<double>(w.f1));
      const V one = splat<double>(1.0), irj = one / (y0 + y1), nb0 = y0 * irj, nb1 = y1 * irj;
      const V inj = one / (a0[j] * nb0 + a1[j] * nb1);
      b0[j] = nb0, b1[j] = nb1, ir[j] = pick(rl, irj, one), in[j] = inj;
      p[j] = pick(rl, a1[j] * nb1 * inj, V{});
      total += p[j];
      v0 = pick(rl, u0[j] * nb0, v0), v1 = pick(rl, u1[j] * nb1, v1);
      started |= rl;
    }
  }

  // chains with a real position whose marginals are all below kTiny
  int bad() const {
    int count = 0;
    for (int l = 0; l < lanes; ++l) count += any[l] && !(total[l] > kTiny);
    return count;
  }

  // lam / S (normalise) or 1 per lane; 0 for chains without a real position or out of range
  V scale(bool normalise, double lam) const {
    V out{};
    for (int l = 0; l < W; ++l)
      out[l] = !any[l] ? 0.0 : !normalise ? 1.0 : total[l] > kTiny ? lam / total[l] : 0.0;
    return out;
  }

  // dL/dtheta of the block's chains into dtheta; returns dL/dW's four sums over the lanes
  void backward(const T* grad, T* dtheta, bool normalise, double lam, double* dw) {
    const V sc = scale(normalise, lam);
    // G's coefficients: dL/dp, up to the factor sc (normalise: dL/dw - sum_k p_k dL/dw_k / S)
    V mean{};
    for (int64_t j = 0; j < n; ++j) {
      I rl;  // real[j] already
      rg[j] = gather(grad, j, rl);
      mean += p[j] * rg[j];
    }
    if (normalise) {
      for (int l = 0; l < W; ++l) mean[l] = total[l] > kTiny ? mean[l] / total[l] : 0.0;
      for (int64_t j = 0; j < n; ++j) rg[j] = pick(real[j], rg[j] - mean, V{});
    }
    V eg{};  // E[G]
    for (int64_t j = 0; j < n; ++j) eg += rg[j] * p[j];
    // B backward
    I started{};
    V w0{}, w1{};
    for (int64_t j = n - 1; j >= 0; --j) {
      const I rl = real[j];
      const V f0 = pick(started, (w.e00 * w0 + w.e01 * w1) * ir[j], V{});
      const V f1 = pick(started, (w.e10 * w0 + w.e11 * w1) * ir[j], V{});
      fb0[j] = f0, fb1[j] = f1;
      w0 = pick(rl, u0[j] * f0, w0), w1 = pick(rl, u1[j] * (f1 + b1[j] * rg[j]), w1);
      started |= rl;
    }
    // A forward, dL/dtheta, and the statistics of transitions, first and last states
    started = I{};
    V fp0{}, fp1{}, ap0{}, ap1{};  // A and alpha at the previous real position
    V d00{}, d01{}, d10{}, d11{};
    V first0{}, first1{}, pfirst0{}, pfirst1{}, last0{}, last1{}, plast0{}, plast1{};
    for (int64_t j = 0; j < n; ++j) {
      const I rl = real[j];
      const V q0 = pick(started, fp0 * w.e00 + fp1 * w.e10, V{});
      const V q1 = pick(started, fp0 * w.e01 + fp1 * w.e11, V{});
      const V f0 = q0 * u0[j] * ic[j], f1 = q1 * u1[j] * ic[j] + a1[j] * rg[j];
      const V inv = in[j];
      const V ezg = (f1 * b1[j] + a1[j] * fb1[j]) * inv;
      scatter(dtheta, j, pick(rl, sc * (ezg - p[j] * eg), V{}));
      // transitions from the previous real position into j
      const I moved = started & rl;
      const V norm = inv * ic[j];
      const V g1 = b1[j] * rg[j] + fb1[j];  // state 1 at j: its part of G, then the rest
      const V k0 = u0[j] * norm, k1 = u1[j] * norm;
      d00 += pick(moved, (fp0 * b0[j] + ap0 * fb0[j] - ap0 * b0[j] * eg) * (w.e00 * k0), V{});
      d01 += pick(moved, (fp0 * b1[j] + ap0 * g1 - ap0 * b1[j] * eg) * (w.e01 * k1), V{});
      d10 += pick(moved, (fp1 * b0[j] + ap1 * fb0[j] - ap1 * b0[j] * eg) * (w.e10 * k0), V{});
      d11 += pick(moved, (fp1 * b1[j] + ap1 * g1 - ap1 * b1[j] * eg) * (w.e11 * k1), V{});
      const I opening = rl & ~started;
      first0 = pick(opening, a0[j] * fb0[j] * inv, first0);
      first1 = pick(opening, a1[j] * g1 * inv, first1);
      pfirst0 = pick(opening, a0[j] * b0[j] * inv, pfirst0);
      pfirst1 = pick(opening, a1[j] * b1[j] * inv, pfirst1);
      last0 = pick(rl, f0 * b0[j] * inv, last0), last1 = pick(rl, f1 * b1[j] * inv, last1);
      plast0 = pick(rl, a0[j] * b0[j] * inv, plast0);
      plast1 = pick(rl, a1[j] * b1[j] * inv, plast1);
      fp0 = pick(rl, f0, fp0), fp1 = pick(rl, f1, fp1);
      ap0 = pick(rl, a0[j], ap0), ap1 = pick(rl, a1[j], ap1);
      started |= rl;
    }
    const V c0 = 0.5 * (first0 - pfirst0 * eg), c1 = 0.5 * (first1 - pfirst1 * eg);
    const V l0 = 0.5 * (last0 - plast0 * eg), l1 = 0.5 * (last1 - plast1 * eg);
    dw[0] += lane_sum(sc * (d00 + c0 + l0));
    dw[1] += lane_sum(sc * (d01 + c1 + l0));
    dw[2] += lane_sum(sc * (d10 + c0 + l1));
    dw[3] += lane_sum(sc * (d11 + c1 + l1));
  }
};

// fn(block, b) after the forward-backward of each block b of W chains, the blocks split over
// the threads; returns the number of chains out of range (counted for the weights only)
template <typename T, typename F>
int64_t for_blocks(const T* theta, const bool* mask, const double* wp, int64_t rows, int64_t n,
                   int normalise, int nthreads, int64_t work_per_position, F&& fn) {
  const Potentials w(wp);
  std::mutex mu;
  int64_t bad = 0;
  parallel((rows + W - 1) / W, nthreads, work_per_position * n * W, 16384,
           [&](int64_t begin, int64_t end) {
             Block<T> blk(theta, mask, n, w);
             int64_t count = 0;
             for (int64_t b = begin; b < end; ++b) {
               blk.forward_backward(b * W, static_cast<int>(std::min<int64_t>(W, rows - b * W)));
               if (normalise) count += blk.bad();
               fn(blk, b);
             }
             std::lock_guard<std::mutex> lock(mu);
             bad += count;
           });
  return bad;
}

template <typename T>
int64_t forward(const T* theta, const bool* mask, const double* wp, T* out, int64_t rows,
                int64_t n, int normalise, double lam, int nthreads) {
  return for_blocks(theta, mask, wp, rows, n, normalise, nthreads, 2,
                    [&](Block<T>& blk, int64_t) {
                      const V sc = blk.scale(normalise != 0, lam);
                      for (int64_t j = 0; j < n; ++j) blk.scatter(out, j, blk.p[j] * sc);
                    });
}

template <typename T>
int64_t backward(const T* theta, const bool* mask, const double* wp, const T* grad, T* dtheta,
                 double* dw, int64_t rows, int64_t n, int normalise, double lam, int nthreads) {
  const int64_t blocks = (rows + W - 1) / W;
  std::vector<double> partial(4 * blocks, 0.0);
  const int64_t bad = for_blocks(theta, mask, wp, rows, n, normalise, nthreads, 4,
                                 [&](Block<T>& blk, int64_t b) {
                                   blk.backward(grad, dtheta, normalise != 0, lam,
                                                partial.data() + 4 * b);
                                 });
  for (int q = 0; q < 4; ++q) {
    dw[q] = 0;
    for (int64_t b = 0; b < blocks; ++b) dw[q] += partial[4 * b + q];
  }
  return bad;
}

}  // namespace

extern "C" {

// The marginals (normalise 0) or lam * p / S (normalise 1) of each chain into out; returns
// the number of chains out of range (see Range; their rows of out are not to be used)
int64_t crf_chain_forward_f32(const float* theta, const bool* mask, const double* w,
                              float* out, int64_t rows, int64_t n, int normalise, double lam,
                              int nthreads) {
  return forward<float>(theta, mask, w, out, rows, n, normalise, lam, nthreads);
}

int64_t crf_chain_forward_f64(const double* theta, const bool* mask, const double* w,
                              double* out, int64_t rows, int64_t n, int normalise, double lam,
                              int nthreads) {
  return forward<double>(theta, mask, w, out, rows, n, normalise, lam, nthreads);
}

// From dL/d(the forward's out) (grad): dL/dtheta into dtheta, dL/dW (4 doubles) into dw;
// returns the number of chains out of range
int64_t crf_chain_backward_f32(const float* theta, const bool* mask, const double* w,
                               const float* grad, float* dtheta, double* dw, int64_t rows,
                               int64_t n, int normalise, double lam, int nthreads) {
  return backward<float>(theta, mask, w, grad, dtheta, dw, rows, n, normalise, lam, nthreads);
}

int64_t crf_chain_backward_f64(const double* theta, const bool* mask, const double* w,
                               const double* grad, double* dtheta, double* dw, int64_t rows,
                               int64_t n, int normalise, double lam, int nthreads) {
  return backward<double>(theta, mask, w, grad, dtheta, dw, rows, n, normalise, lam,
                          nthreads);
}

}  // extern "C"
