// DLRM's dot interaction on CPU, with the batch in the SIMD lanes.
//
// bmm(t, t^T) over [n, f, d] runs n tiny [f, d] x [d, f] products: far from the GEMM rate on
// CPU, and half of its output (the upper triangle and the diagonal) is thrown away. Here a
// block of kLanes samples is transposed to [f][d][lane] in a local buffer, so each pair's dot
// product is d fused multiply-adds of whole vectors (one sample per lane): no horizontal sums,
// only the f(f-1)/2 pairs the model uses (up to the padding of 4 x 4 tiles). Blocks move in and
// out of the lanes by 16 x 16 transposes in registers. Sums run over d (forward) and over the
// inputs (backward) in order, per sample, in fp32. At f 27, d 64, batch 2048 on one core of the
// development machine: forward 4.7 -> 2.4 ms, backward 8.2 -> 5.5 ms against the
// pair-at-a-time version with scalar transposes.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace picasso {
namespace cpu {
namespace {

constexpr int kLanes = 16;
typedef float vec __attribute__((vector_size(kLanes * sizeof(float))));

// A 64-byte-aligned vec buffer (std::vector drops the vector type's alignment).
struct VecBuffer {
  vec* p;
  explicit VecBuffer(int64_t n)
      : p(static_cast<vec*>(std::aligned_alloc(sizeof(vec), std::max<int64_t>(n, 1) * sizeof(vec)))) {
    if (p == nullptr) throw std::bad_alloc();
  }
  ~VecBuffer() { std::free(p); }
  VecBuffer(const VecBuffer&) = delete;
  VecBuffer& operator=(const VecBuffer&) = delete;
};

typedef int ivec __attribute__((vector_size(kLanes * sizeof(int))));

// One stage of a 16 x 16 transpose held in 16 vectors: exchanges bit S of the row index with bit
// S of the lane index (swaps the off-diagonal S x S blocks). The four stages commute.
template <int S>
inline __attribute__((always_inline)) void transpose_stage(vec* r, ivec lo, ivec hi) {
  for (int i = 0; i < kLanes; ++i)
    if ((i & S) == 0) {
      const vec a = r[i], b = r[i + S];
      r[i] = __builtin_shuffle(a, b, lo);
      r[i + S] = __builtin_shuffle(a, b, hi);
    }
}

inline __attribute__((always_inline)) void transpose16(vec* r) {
  transpose_stage<8>(r, ivec{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                     ivec{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
  transpose_stage<4>(r, ivec{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                     ivec{4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31});
  transpose_stage<2>(r, ivec{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                     ivec{2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31});
  transpose_stage<1>(r, ivec{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
                     ivec{1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31});
}

// dst[c] for c < cols gets, in lane l, src[l * stride + c] for the nb samples l < nb (zero
// beyond): rows of samples into vectors with one sample per lane, 16 columns at a time.
inline __attribute__((always_inline)) void to_lanes(const float* src, int64_t stride, int64_t nb, int64_t cols,
                                                    vec* dst) {
  int64_t c0 = 0;
  for (; c0 + kLanes <= cols; c0 += kLanes) {
    vec r[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) {
      if (l < nb) std::memcpy(&r[l], src + l * stride + c0, sizeof(vec));
      else r[l] = vec{};
    }
    transpose16(r);
    for (int64_t c = 0; c < kLanes; ++c) dst[c0 + c] = r[c];
  }
  for (int64_t c = c0; c < cols; ++c) {
    float* lanes = reinterpret_cast<float*>(dst + c);
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = l < nb ? src[l * stride + c] : 0.0f;
  }
}

// The inverse of to_lanes for the nb samples: dst[l * stride + c] = lane l of src[c], plus
// add[l * add_stride + c] first when add is given (the result is add + lane, as written).
inline __attribute__((always_inline)) void from_lanes(const vec* src, int64_t cols, int64_t nb, float* dst,
                                                      int64_t stride, const float* add, int64_t add_stride) {
  int64_t c0 = 0;
  for (; c0 + kLanes <= cols; c0 += kLanes) {
    vec r[kLanes];
    for (int64_t c = 0; c < kLanes; ++c) r[c] = src[c0 + c];
    transpose16(r);
    for (int64_t l = 0; l < nb; ++l) {
      if (add != nullptr) {
        vec a;
        std::memcpy(&a, add + l * add_stride + c0, sizeof(vec));
        r[l] = a + r[l];
      }
      std::memcpy(dst + l * stride + c0, &r[l], sizeof(vec));
    }
  }
  for (int64_t c = c0; c < cols; ++c) {
    const float* lanes = reinterpret_cast<const float*>(src + c);
    for (int64_t l = 0; l < nb; ++l)
      dst[l * stride + c] = add != nullptr ? add[l * add_stride + c] + lanes[l] : lanes[l];
  }
}

// Register tiles of kTile x kTile: pair dot products (forward) or gradient rows x dims (backward)
// held in 16 vector accumulators, so each vector loaded feeds kTile fused multiply-adds. The
// transposed block ([f][d] vectors, 110 KB at f 27, d 64) does not fit in L1; one load per
// multiply-add, as a pair-at-a-time loop does, left the kernel waiting on L2.
constexpr int64_t kTile = 4;

int64_t padded(int64_t f) { return (f + kTile - 1) / kTile * kTile; }

// Vectors between consecutive inputs in the transposed block: d plus one, so that the rows a
// tile reads at the same k do not all fall in one L1 set (at d 64 they would sit 4 KB apart).
int64_t row_stride(int64_t d) { return d + 1; }

// The register tile both directions share: acc[r][c] = sum over q < n, in order, of
// x[r][q * sx] * y[c][q * sy] (forward: rows of two input blocks over the dims; backward: the
// pair-gradient rows against the inputs' columns over the inputs). The 16 sums stay in
// registers once inlined and unrolled.
inline __attribute__((always_inline)) void tile_sums(const vec* const* x, int64_t sx, const vec* const* y, int64_t sy,
                                                     int64_t n, vec (&acc)[kTile][kTile]) {
#pragma GCC unroll 4
  for (int64_t r = 0; r < kTile; ++r)
#pragma GCC unroll 4
    for (int64_t c = 0; c < kTile; ++c) acc[r][c] = vec{};
  for (int64_t q = 0; q < n; ++q) {
    vec xs[kTile];
#pragma GCC unroll 4
    for (int64_t r = 0; r < kTile; ++r) xs[r] = x[r][q * sx];
#pragma GCC unroll 4
    for (int64_t c = 0; c < kTile; ++c) {
      const vec yc = y[c][q * sy];
#pragma GCC unroll 4
      for (int64_t r = 0; r < kTile; ++r) acc[r][c] += xs[r] * yc;
    }
  }
}

// One range of sample blocks of the forward. Cloned per instruction set (AVX-512, AVX2, generic),
// chosen when the library loads; no lambdas or OpenMP inside, which would not inherit the clone's target.
__attribute__((target_clones("avx512f", "avx2", "default"))) void dot_forward_blocks(
    const float* const* rows, int64_t f, int64_t d, int64_t n, float* out, int64_t b0, int64_t b1) {
  const int64_t pairs = f * (f - 1) / 2, width = d + pairs, fp = padded(f);
  const int64_t ld = row_stride(d);
  VecBuffer tb(fp * ld), zb(pairs);
  vec *const t = tb.p, *const z = zb.p;
  std::memset(static_cast<void*>(t + f * ld), 0, (fp - f) * ld * sizeof(vec));  // padding rows stay zero
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t n0 = blk * kLanes, nb = std::min<int64_t>(kLanes, n - n0);
    for (int64_t i = 0; i < f; ++i) to_lanes(rows[i] + n0 * d, d, nb, d, t + i * ld);
    // tiles of rows i0.. against rows j0.. (j0 <= i0): every pair i > j lies in one of them;
    // each pair sums over d in order, as the reference does
    for (int64_t i0 = 0; i0 < f; i0 += kTile) {
      const vec *a0 = t + i0 * ld, *a1 = a0 + ld, *a2 = a1 + ld, *a3 = a2 + ld;
      for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
        const vec *c0 = t + j0 * ld, *c1 = c0 + ld, *c2 = c1 + ld, *c3 = c2 + ld;
        const vec* const rows_i[kTile] = {a0, a1, a2, a3};
        const vec* const rows_j[kTile] = {c0, c1, c2, c3};
        vec acc[kTile][kTile];
        tile_sums(rows_i, 1, rows_j, 1, d, acc);
        for (int64_t r = 0; r < kTile; ++r) {
          const int64_t i = i0 + r;
          if (i >= f) break;
          for (int64_t c = 0; c < kTile && j0 + c < i; ++c) z[i * (i - 1) / 2 + j0 + c] = acc[r][c];
        }
      }
    }
    for (int64_t l = 0; l < nb; ++l)  // the first input passes through
      std::memcpy(out + (n0 + l) * width, rows[0] + (n0 + l) * d, d * sizeof(float));
    from_lanes(z, pairs, nb, out + n0 * width + d, width, nullptr, 0);
  }
}

// One range of sample blocks of the backward: grad_i = sum_j g_(i,j) t_j over j in order, with
// g the symmetric matrix of the pairs' gradients (zero diagonal), plus the pass-through gradient
// for input 0.
__attribute__((target_clones("avx512f", "avx2", "default"))) void dot_backward_blocks(
    const float* grad, const float* const* rows, int64_t f, int64_t d, int64_t n, float* const* grads, int64_t b0,
    int64_t b1) {
  const int64_t pairs = f * (f - 1) / 2, width = d + pairs, fp = padded(f);
  const int64_t ld = row_stride(d);
  VecBuffer tb(f * ld), pb(pairs), gb(fp * f), ob(fp * ld);
  vec *const t = tb.p, *const gp = pb.p, *const g = gb.p, *const o = ob.p;
  std::memset(static_cast<void*>(g), 0, fp * f * sizeof(vec));  // the diagonal and padding rows stay zero
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t n0 = blk * kLanes, nb = std::min<int64_t>(kLanes, n - n0);
    for (int64_t i = 0; i < f; ++i) to_lanes(rows[i] + n0 * d, d, nb, d, t + i * ld);
    to_lanes(grad + n0 * width + d, width, nb, pairs, gp);
    for (int64_t i = 1; i < f; ++i)
      for (int64_t j = 0; j < i; ++j) g[i * f + j] = g[j * f + i] = gp[i * (i - 1) / 2 + j];
    for (int64_t i0 = 0; i0 < f; i0 += kTile) {
      const vec *w0 = g + i0 * f, *w1 = w0 + f, *w2 = w1 + f, *w3 = w2 + f;
      for (int64_t k0 = 0; k0 < d; k0 += kTile) {
        const int64_t kn = std::min<int64_t>(kTile, d - k0);
        vec acc[kTile][kTile];
        if (kn == kTile) {
          const vec* const grads_i[kTile] = {w0, w1, w2, w3};
          const vec* const cols[kTile] = {t + k0, t + k0 + 1, t + k0 + 2, t + k0 + 3};
          tile_sums(grads_i, 1, cols, ld, f, acc);
        } else {  // the last dims when d is not a multiple of the tile
          for (int64_t r = 0; r < kTile; ++r)
            for (int64_t c = 0; c < kn; ++c) {
              vec s{};
              for (int64_t j = 0; j < f; ++j) s += g[(i0 + r) * f + j] * t[j * ld + k0 + c];
              acc[r][c] = s;
            }
        }
        for (int64_t r = 0; r < kTile; ++r)
          for (int64_t c = 0; c < kn; ++c) o[(i0 + r) * ld + k0 + c] = acc[r][c];
      }
    }
    for (int64_t i = 0; i < f; ++i)  // input 0 also gets the pass-through gradient
      from_lanes(o + i * ld, d, nb, grads[i] + n0 * d, d, i == 0 ? grad + n0 * width : nullptr, width);
  }
}

void check(int64_t f, int64_t d, int64_t n) {
  if (f < 1 || d < 1 || n < 0) throw std::invalid_argument("picasso native: dot interaction needs f >= 1, d >= 1");
}

// Runs work(first block, end block) on each OpenMP thread over its share of the
// kLanes-sample blocks of n samples.
template <class Work>
void over_blocks(int64_t n, Work&& work) {
  const int64_t blocks = (n + kLanes - 1) / kLanes;
#pragma omp parallel
  {
#ifdef _OPENMP
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
#else
    const int64_t nt = 1, id = 0;
#endif
    work(blocks * id / nt, blocks * (id + 1) / nt);
  }
}

}  // namespace

void dot_interaction_forward(const float* const* rows, int64_t f, int64_t d, int64_t n, float* out) {
  check(f, d, n);
  over_blocks(n, [&](int64_t b0, int64_t b1) { dot_forward_blocks(rows, f, d, n, out, b0, b1); });
}

void dot_interaction_backward(const float* grad, const float* const* rows, int64_t f, int64_t d, int64_t n,
                              float* const* grads) {
  check(f, d, n);
  over_blocks(n, [&](int64_t b0, int64_t b1) { dot_backward_blocks(grad, rows, f, d, n, grads, b0, b1); });
}

}  // namespace cpu
}  // namespace picasso
