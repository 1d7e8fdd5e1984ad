// DLRM's dot interaction on CPU, with the batch in the SIMD lanes.
//
// bmm(t, t^T) over [n, f, d] runs n tiny [f, d] x [d, f] products: far from the GEMM rate on
// CPU, and half of its output (the upper triangle and the diagonal) is thrown away. Here a
// block of kLanes samples is transposed to [f][d][lane] in a local buffer, so each pair's dot
// product is d fused multiply-adds of whole vectors (one sample per lane): no horizontal sums,
// only the f(f-1)/2 pairs the model uses, and the backward reads the pairs' gradients in place
// of a scattered symmetric matrix. Sums run over d in order, per sample, in fp32.
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

// Samples [n0, n0 + nb) of the f inputs into buf[(i * d + k)][lane]; lanes >= nb are zero.
#define PICASSO_TRANSPOSE_IN(buf, rows, f, d, n0, nb)                       \
  for (int64_t i_ = 0; i_ < (f); ++i_) {                                   \
    const float* src_ = (rows)[i_] + (n0) * (d);                           \
    float* dst_ = reinterpret_cast<float*>((buf) + i_ * (d));              \
    if ((nb) < kLanes) std::memset(dst_, 0, (d) * sizeof(vec));            \
    for (int64_t l_ = 0; l_ < (nb); ++l_)                                  \
      for (int64_t k_ = 0; k_ < (d); ++k_) dst_[k_ * kLanes + l_] = src_[l_ * (d) + k_]; \
  }

// One range of sample blocks of the forward. Cloned per instruction set (AVX-512, AVX2, generic),
// chosen when the library loads; no lambdas or OpenMP inside, which would not inherit the clone's target.
__attribute__((target_clones("avx512f", "avx2", "default"))) void dot_forward_blocks(
    const float* const* rows, int64_t f, int64_t d, int64_t n, float* out, int64_t b0, int64_t b1) {
  const int64_t pairs = f * (f - 1) / 2, width = d + pairs;
  VecBuffer tb(f * d), zb(pairs);
  vec *const t = tb.p, *const z = zb.p;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t n0 = blk * kLanes, nb = std::min<int64_t>(kLanes, n - n0);
    PICASSO_TRANSPOSE_IN(t, rows, f, d, n0, nb)
    for (int64_t i = 1; i < f; ++i) {
      const vec* ti = t + i * d;
      vec* zi = z + i * (i - 1) / 2;  // pair (i, j) sits at i(i-1)/2 + j
      int64_t j = 0;
      for (; j + 4 <= i; j += 4) {  // four pairs at once: ti is read once for all four
        const vec *a = t + j * d, *b = a + d, *c = b + d, *e = c + d;
        vec s0{}, s1{}, s2{}, s3{};
        for (int64_t k = 0; k < d; ++k) {
          const vec x = ti[k];
          s0 += x * a[k];
          s1 += x * b[k];
          s2 += x * c[k];
          s3 += x * e[k];
        }
        zi[j] = s0;
        zi[j + 1] = s1;
        zi[j + 2] = s2;
        zi[j + 3] = s3;
      }
      for (; j < i; ++j) {
        const vec* a = t + j * d;
        vec s{};
        for (int64_t k = 0; k < d; ++k) s += ti[k] * a[k];
        zi[j] = s;
      }
    }
    const float* zf = reinterpret_cast<const float*>(z);
    for (int64_t l = 0; l < nb; ++l) {
      float* o = out + (n0 + l) * width;
      std::memcpy(o, rows[0] + (n0 + l) * d, d * sizeof(float));  // the first input passes through
      for (int64_t p = 0; p < pairs; ++p) o[d + p] = zf[p * kLanes + l];
    }
  }
}

// One range of sample blocks of the backward: grad_i = sum_{j != i} g_(i,j) t_j, plus the
// pass-through gradient for input 0.
__attribute__((target_clones("avx512f", "avx2", "default"))) void dot_backward_blocks(
    const float* grad, const float* const* rows, int64_t f, int64_t d, int64_t n, float* const* grads, int64_t b0,
    int64_t b1) {
  const int64_t pairs = f * (f - 1) / 2, width = d + pairs;
  constexpr int64_t kChunk = 8;  // output columns held in registers at once
  VecBuffer tb(f * d), gb(pairs), ob(d);
  vec *const t = tb.p, *const g = gb.p, *const o = ob.p;
  std::vector<int64_t> pair_of(f * f, 0);
  for (int64_t i = 0; i < f; ++i)
    for (int64_t j = 0; j < f; ++j)
      if (i != j) pair_of[i * f + j] = i > j ? i * (i - 1) / 2 + j : j * (j - 1) / 2 + i;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t n0 = blk * kLanes, nb = std::min<int64_t>(kLanes, n - n0);
    PICASSO_TRANSPOSE_IN(t, rows, f, d, n0, nb)
    float* gf = reinterpret_cast<float*>(g);
    if (nb < kLanes) std::memset(gf, 0, pairs * sizeof(vec));
    for (int64_t l = 0; l < nb; ++l) {
      const float* gz = grad + (n0 + l) * width + d;
      for (int64_t p = 0; p < pairs; ++p) gf[p * kLanes + l] = gz[p];
    }
    for (int64_t i = 0; i < f; ++i) {
      const int64_t* pi = pair_of.data() + i * f;
      int64_t k0 = 0;
      for (; k0 + kChunk <= d; k0 += kChunk) {
        vec s0{}, s1{}, s2{}, s3{}, s4{}, s5{}, s6{}, s7{};
        for (int64_t j = 0; j < f; ++j) {
          if (j == i) continue;
          const vec w = g[pi[j]];
          const vec* tj = t + j * d + k0;
          s0 += w * tj[0];
          s1 += w * tj[1];
          s2 += w * tj[2];
          s3 += w * tj[3];
          s4 += w * tj[4];
          s5 += w * tj[5];
          s6 += w * tj[6];
          s7 += w * tj[7];
        }
        o[k0] = s0;
        o[k0 + 1] = s1;
        o[k0 + 2] = s2;
        o[k0 + 3] = s3;
        o[k0 + 4] = s4;
        o[k0 + 5] = s5;
        o[k0 + 6] = s6;
        o[k0 + 7] = s7;
      }
      for (; k0 < d; ++k0) {
        vec s{};
        for (int64_t j = 0; j < f; ++j)
          if (j != i) s += g[pi[j]] * t[j * d + k0];
        o[k0] = s;
      }
      float* dst = grads[i] + n0 * d;
      const float* of = reinterpret_cast<const float*>(o);
      for (int64_t l = 0; l < nb; ++l) {
        float* r = dst + l * d;
        if (i == 0) {
          const float* pass = grad + (n0 + l) * width;
          for (int64_t k = 0; k < d; ++k) r[k] = pass[k] + of[k * kLanes + l];
        } else {
          for (int64_t k = 0; k < d; ++k) r[k] = of[k * kLanes + l];
        }
      }
    }
  }
}

#undef PICASSO_TRANSPOSE_IN

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
