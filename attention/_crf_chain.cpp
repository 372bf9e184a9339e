// Structured (segmentation) attention's linear-chain CRF on CPU, one chain at a time
// (attention/_crf_chain_ext.py builds and loads this file through attention/_native.py: a
// plain C interface, no torch header).  attention/structured.py's forward_backward runs the
// same recursions in log space as a Python loop over positions, vectorised over chains, each
// step a handful of small tensor operations that autograd records; with a score row of
// hundreds of keys (IMDb: 256) that loop, and autograd's replay of it, is most of a training
// step.  Here each chain is worked through in a few passes while it is in cache.
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
// sums over neighbouring real positions of the same products (see backward_chain).  For the
// weights w = lam p / S (S = sum of p over the chain) the chain rule first turns dL/dw into
// dL/dp = (lam / S) (dL/dw - sum_k w_k dL/dw_k / lam).  No logarithm anywhere: one exp per
// position.
//
// Range: p_j is formed as a product of normalised factors, so it underflows only below
// about 1e-308; a chain whose every p_j is below 1e-290 (scores around -670 and lower, where
// S itself is not representable) is reported (the return value counts such chains) and the
// caller uses the log-space recursion of structured.py instead.
//
// Arguments: theta (rows, n) contiguous, mask (rows, n) bool or null (all real), w: W as
// 4 values (row major), out (rows, n); backward: grad (rows, n), dtheta (rows, n), dw: 4
// doubles (written, summed over every chain in blocks of 64 chains, then over the blocks in
// order: the same sum whatever the number of threads).  Threads: OpenMP when built with it (sharing
// torch's libgomp), else std::thread; chains are split over nthreads.

#include <cmath>
#include <mutex>

#include "_simd.h"

namespace {

constexpr double kTiny = 1e-290;

struct Chain {
  // per real position, in order: its index, u, alpha, beta and the normalisers c (alpha) and
  // r (beta) and N = alpha . beta
  std::vector<int64_t> at;
  std::vector<double> u0, u1, a0, a1, b0, b1, c, r, nn;
  explicit Chain(int64_t n)
      : at(n), u0(n), u1(n), a0(n), a1(n), b0(n), b1(n), c(n), r(n), nn(n) {}
};

struct Potentials {
  double e00, e01, e10, e11, s0, s1, f0, f1;  // E = exp(W), s = exp(start), f = exp(end)
  explicit Potentials(const double* w) {
    e00 = std::exp(w[0]), e01 = std::exp(w[1]), e10 = std::exp(w[2]), e11 = std::exp(w[3]);
    s0 = std::exp(0.5 * (w[0] + w[2])), s1 = std::exp(0.5 * (w[1] + w[3]));
    f0 = std::exp(0.5 * (w[0] + w[1])), f1 = std::exp(0.5 * (w[2] + w[3]));
  }
};

// alpha, beta, N of one chain; returns the number of real positions
template <typename T>
int64_t forward_chain(const T* theta, const bool* mask, int64_t n, const Potentials& w,
                      Chain& ch) {
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (mask && !mask[j]) continue;
    const double t = static_cast<double>(theta[j]);
    const double x = std::exp(-std::fabs(t));  // u = (exp(-m), exp(t - m)), m = max(0, t)
    const double u0 = t > 0 ? x : 1.0, u1 = t > 0 ? 1.0 : x;
    double q0, q1;
    if (m == 0) {
      q0 = w.s0, q1 = w.s1;
    } else {
      q0 = ch.a0[m - 1] * w.e00 + ch.a1[m - 1] * w.e10;
      q1 = ch.a0[m - 1] * w.e01 + ch.a1[m - 1] * w.e11;
    }
    const double x0 = q0 * u0, x1 = q1 * u1, cj = x0 + x1;
    ch.at[m] = j, ch.u0[m] = u0, ch.u1[m] = u1;
    ch.a0[m] = x0 / cj, ch.a1[m] = x1 / cj, ch.c[m] = cj;
    ++m;
  }
  for (int64_t k = m - 1; k >= 0; --k) {
    double y0, y1;
    if (k == m - 1) {
      y0 = w.f0, y1 = w.f1;
    } else {
      const double v0 = ch.u0[k + 1] * ch.b0[k + 1], v1 = ch.u1[k + 1] * ch.b1[k + 1];
      y0 = w.e00 * v0 + w.e01 * v1;
      y1 = w.e10 * v0 + w.e11 * v1;
    }
    const double rk = y0 + y1;
    ch.b0[k] = y0 / rk, ch.b1[k] = y1 / rk, ch.r[k] = rk;
    ch.nn[k] = ch.a0[k] * ch.b0[k] + ch.a1[k] * ch.b1[k];
  }
  return m;
}

inline double marginal(const Chain& ch, int64_t k) { return ch.a1[k] * ch.b1[k] / ch.nn[k]; }

// weights (normalise) or marginals of a chain into out (0 at masked positions); false when the
// chain's marginals are all below kTiny (see Range)
template <typename T>
bool forward_row(const T* theta, const bool* mask, int64_t n, const Potentials& w,
                 bool normalise, double lam, Chain& ch, T* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = T(0);
  const int64_t m = forward_chain(theta, mask, n, w, ch);
  if (m == 0) return true;
  double total = 0;
  for (int64_t k = 0; k < m; ++k) total += marginal(ch, k);
  if (normalise && !(total > kTiny)) return false;
  const double scale = normalise ? lam / total : 1.0;
  for (int64_t k = 0; k < m; ++k) out[ch.at[k]] = static_cast<T>(marginal(ch, k) * scale);
  return true;
}

// dL/dtheta of a chain into dtheta (0 at masked positions) and dL/dW added to dw
template <typename T>
bool backward_row(const T* theta, const bool* mask, int64_t n, const Potentials& w,
                  bool normalise, double lam, const T* grad, Chain& ch, std::vector<double>& rg,
                  std::vector<double>& fa0, std::vector<double>& fa1, std::vector<double>& fb0,
                  std::vector<double>& fb1, T* dtheta, double* dw) {
  for (int64_t j = 0; j < n; ++j) dtheta[j] = T(0);
  const int64_t m = forward_chain(theta, mask, n, w, ch);
  if (m == 0) return true;
  // g = dL/dp at the real positions (normalise: through w = lam p / S), times `scale`
  double total = 0, scale = 1.0;
  for (int64_t k = 0; k < m; ++k) total += marginal(ch, k);
  if (normalise) {
    if (!(total > kTiny)) return false;
    double mean = 0;  // sum_k w_k dL/dw_k / lam = sum_k p_k dL/dw_k / S
    for (int64_t k = 0; k < m; ++k) mean += marginal(ch, k) * grad[ch.at[k]];
    mean /= total;
    for (int64_t k = 0; k < m; ++k) rg[k] = static_cast<double>(grad[ch.at[k]]) - mean;
    scale = lam / total;
  } else {
    for (int64_t k = 0; k < m; ++k) rg[k] = static_cast<double>(grad[ch.at[k]]);
  }
  double eg = 0;  // E[G]
  for (int64_t k = 0; k < m; ++k) eg += rg[k] * marginal(ch, k);
  // the semiring's accumulators (A: fa, B: fb)
  for (int64_t k = 0; k < m; ++k) {
    double q0 = 0, q1 = 0;
    if (k > 0) {
      q0 = fa0[k - 1] * w.e00 + fa1[k - 1] * w.e10;
      q1 = fa0[k - 1] * w.e01 + fa1[k - 1] * w.e11;
    }
    fa0[k] = q0 * ch.u0[k] / ch.c[k];
    fa1[k] = q1 * ch.u1[k] / ch.c[k] + ch.a1[k] * rg[k];
  }
  for (int64_t k = m - 1; k >= 0; --k) {
    if (k == m - 1) {
      fb0[k] = fb1[k] = 0;
      continue;
    }
    const double v0 = ch.u0[k + 1] * fb0[k + 1];
    const double v1 = ch.u1[k + 1] * (fb1[k + 1] + ch.b1[k + 1] * rg[k + 1]);
    fb0[k] = (w.e00 * v0 + w.e01 * v1) / ch.r[k];
    fb1[k] = (w.e10 * v0 + w.e11 * v1) / ch.r[k];
  }
  for (int64_t k = 0; k < m; ++k) {
    const double ezg = (fa1[k] * ch.b1[k] + ch.a1[k] * fb1[k]) / ch.nn[k];
    dtheta[ch.at[k]] = static_cast<T>(scale * (ezg - marginal(ch, k) * eg));
  }
  // dL/dW: transitions between neighbouring real positions t -> k = t + 1
  const double e[2][2] = {{w.e00, w.e01}, {w.e10, w.e11}};
  double d[2][2] = {{0, 0}, {0, 0}};
  for (int64_t k = 1; k < m; ++k) {
    const int64_t t = k - 1;
    const double at[2] = {ch.a0[t], ch.a1[t]}, fat[2] = {fa0[t], fa1[t]};
    const double bk[2] = {ch.b0[k], ch.b1[k]}, fbk[2] = {fb0[k], fb1[k]};
    const double uk[2] = {ch.u0[k], ch.u1[k]}, gk[2] = {0.0, rg[k]};
    const double norm = 1.0 / (ch.c[k] * ch.nn[k]);
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        const double f = e[a][b] * uk[b] * norm;
        const double xi = at[a] * bk[b] * f;
        const double exg = (fat[a] * bk[b] + at[a] * (bk[b] * gk[b] + fbk[b])) * f;
        d[a][b] += exg - xi * eg;
      }
  }
  // start and end: Cov([z_first = c], G) / 2 to W[., c], Cov([z_last = c], G) / 2 to W[c, .]
  const double first[2] = {ch.a0[0] * fb0[0] / ch.nn[0],
                           ch.a1[0] * (ch.b1[0] * rg[0] + fb1[0]) / ch.nn[0]};
  const double pfirst[2] = {ch.a0[0] * ch.b0[0] / ch.nn[0], ch.a1[0] * ch.b1[0] / ch.nn[0]};
  const int64_t l = m - 1;
  const double last[2] = {fa0[l] * ch.b0[l] / ch.nn[l], fa1[l] * ch.b1[l] / ch.nn[l]};
  const double plast[2] = {ch.a0[l] * ch.b0[l] / ch.nn[l], ch.a1[l] * ch.b1[l] / ch.nn[l]};
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      dw[2 * a + b] += scale * (d[a][b] + 0.5 * (first[b] - pfirst[b] * eg) +
                                0.5 * (last[a] - plast[a] * eg));
  return true;
}

template <typename T>
int64_t forward(const T* theta, const bool* mask, const double* wp, T* out, int64_t rows,
                int64_t n, int normalise, double lam, int nthreads) {
  const Potentials w(wp);
  std::mutex mu;
  int64_t bad = 0;
  parallel(rows, nthreads, n, 16384, [&](int64_t begin, int64_t end) {
    Chain ch(n);
    int64_t count = 0;
    for (int64_t i = begin; i < end; ++i)
      count += !forward_row(theta + i * n, mask ? mask + i * n : nullptr, n, w, normalise != 0,
                            lam, ch, out + i * n);
    std::lock_guard<std::mutex> lock(mu);
    bad += count;
  });
  return bad;
}

template <typename T>
int64_t backward(const T* theta, const bool* mask, const double* wp, const T* grad, T* dtheta,
                 double* dw, int64_t rows, int64_t n, int normalise, double lam, int nthreads) {
  // dL/dW is summed per block of kBlock chains, then over blocks in order: the same sum
  // whatever the number of threads
  constexpr int64_t kBlock = 64;
  const Potentials w(wp);
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  std::vector<double> partial(4 * blocks, 0.0);
  std::mutex mu;
  int64_t bad = 0;
  parallel(blocks, nthreads, 3 * n * kBlock, 16384, [&](int64_t begin, int64_t end) {
    Chain ch(n);
    std::vector<double> rg(n), fa0(n), fa1(n), fb0(n), fb1(n);
    int64_t count = 0;
    for (int64_t blk = begin; blk < end; ++blk)
      for (int64_t i = blk * kBlock; i < std::min(rows, (blk + 1) * kBlock); ++i)
        count += !backward_row(theta + i * n, mask ? mask + i * n : nullptr, n, w,
                               normalise != 0, lam, grad + i * n, ch, rg, fa0, fa1, fb0, fb1,
                               dtheta + i * n, partial.data() + 4 * blk);
    std::lock_guard<std::mutex> lock(mu);
    bad += count;
  });
  for (int q = 0; q < 4; ++q) {
    dw[q] = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) dw[q] += partial[4 * blk + q];
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
