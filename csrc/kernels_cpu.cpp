// CPU kernels of the embedding hot path: plain C++17 + OpenMP, no torch headers, so this file
// compiles in seconds and the binding (binding.cpp) rarely needs a rebuild.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.h"

namespace picasso {
namespace cpu {
namespace {

// ---- 16-bit float storage types, converted to fp32 for arithmetic -------------------------
struct Half {
  uint16_t x;
};
struct BFloat16 {
  uint16_t x;
};

inline float f32_from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// IEEE half <-> float with round-to-nearest-even (after Maratyszcza's FP16 library).
inline float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result =
      sign | (two_w < (1u << 27) ? f32_to_bits(denormalized) : f32_to_bits(normalized));
  return f32_from_bits(result);
}
inline uint16_t float_to_half(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = f32_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_to_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t b = f32_to_bits(f);
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

template <class T>
struct Acc {
  using type = T;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};
template <>
struct Acc<Half> {
  using type = float;
  static float load(Half v) { return half_to_float(v.x); }
  static Half store(float v) { return Half{float_to_half(v)}; }
};
template <>
struct Acc<BFloat16> {
  using type = float;
  static float load(BFloat16 v) { return f32_from_bits(static_cast<uint32_t>(v.x) << 16); }
  static BFloat16 store(float v) { return BFloat16{float_to_bf16(v)}; }
};

// Call f with a null pointer of the C++ type matching dt (type tag dispatch).
template <class F>
void dispatch(DType dt, F&& f) {
  switch (dt) {
    case DType::F32:
      return f(static_cast<float*>(nullptr));
    case DType::F64:
      return f(static_cast<double*>(nullptr));
    case DType::F16:
      return f(static_cast<Half*>(nullptr));
    case DType::BF16:
      return f(static_cast<BFloat16*>(nullptr));
  }
  throw std::invalid_argument("picasso native: unsupported dtype");
}

// Below this many element operations a parallel region costs more than it saves.
constexpr int64_t kParallelGrain = 1 << 15;

[[noreturn]] void throw_index(const char* what, int64_t pos, int64_t value, int64_t limit) {
  throw std::out_of_range(std::string("picasso native: ") + what + " at position " + std::to_string(pos) +
                          " is " + std::to_string(value) + ", expected 0 <= value < " + std::to_string(limit));
}

[[noreturn]] void throw_bad_bag(const int64_t* offsets, int64_t b, int64_t num_indices) {
  throw std::out_of_range("picasso native: offsets of bag " + std::to_string(b) + " are [" +
                          std::to_string(offsets[b]) + ", " + std::to_string(offsets[b + 1]) +
                          "), expected non-decreasing offsets within [0, " + std::to_string(num_indices) + "]");
}

// ---- grouping of int64 keys (the core of unique, bag backward and sparse update) ---------
// Groups hold the distinct keys ascending, where each group starts in `perm` (positions sorted
// by key, ties kept in position order so sums run in the same order as index_add_).
struct Groups {
  std::vector<int64_t> perm;   // filled only when requested
  std::vector<int64_t> start;  // start[u] .. start[u+1] indexes perm; start[U] = n
  std::vector<int64_t> key;
  int64_t size() const { return static_cast<int64_t>(key.size()); }
};

// LSD radix sort on the key bits of `a` (key_of gives the key relative to the minimum);
// stable, so equal keys stay in position order. Digits as even as possible, at most 11 bits.
template <class Item, class KeyOf>
void radix_sort(std::vector<Item>& a, int bits, KeyOf key_of) {
  const int passes = (bits + 10) / 11;
  const int width = (bits + passes - 1) / passes;
  const uint64_t mask = (uint64_t{1} << width) - 1;
  std::vector<Item> tmp(a.size());
  std::vector<int64_t> hist(size_t{1} << width);
  for (int p = 0; p < passes; ++p) {
    const int shift = p * width;
    std::fill(hist.begin(), hist.end(), 0);
    for (const Item& it : a) ++hist[(key_of(it) >> shift) & mask];
    int64_t sum = 0;
    for (auto& h : hist) {
      const int64_t c = h;
      h = sum;
      sum += c;
    }
    for (const Item& it : a) tmp[hist[(key_of(it) >> shift) & mask]++] = it;
    a.swap(tmp);
  }
}

// Walks sorted items once to fill the groups, perm and inverse.
template <class Item, class KeyOf, class PosOf>
void groups_from_sorted(const std::vector<Item>& a, int64_t lo, KeyOf key_of, PosOf pos_of, bool need_perm,
                        int64_t* inverse, Groups& g) {
  const int64_t n = static_cast<int64_t>(a.size());
  if (need_perm) g.perm.resize(n);
  uint64_t prev = 0;
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t kk = key_of(a[k]);
    const int64_t pos = pos_of(a[k]);
    if (k == 0 || kk != prev) {
      g.key.push_back(static_cast<int64_t>(kk + static_cast<uint64_t>(lo)));
      g.start.push_back(k);
      prev = kk;
    }
    if (need_perm) g.perm[k] = pos;
    if (inverse) inverse[pos] = g.size() - 1;
  }
  g.start.push_back(n);
}

void group_by_key(const int64_t* keys, int64_t n, bool need_perm, int64_t* inverse, Groups& g) {
  g.perm.clear();
  g.start.clear();
  g.key.clear();
  if (n == 0) {
    g.start.push_back(0);
    return;
  }
  int64_t lo = keys[0], hi = keys[0];
  bool ascending = true;
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, keys[i]);
    hi = std::max(hi, keys[i]);
    ascending &= keys[i - 1] <= keys[i];
  }
  if (ascending) {
    // Already sorted (e.g. the unique rows bag_backward hands to sparse_update): runs are groups.
    if (need_perm) {
      g.perm.resize(n);
      for (int64_t i = 0; i < n; ++i) g.perm[i] = i;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (i == 0 || keys[i] != keys[i - 1]) {
        g.key.push_back(keys[i]);
        g.start.push_back(i);
      }
      if (inverse) inverse[i] = g.size() - 1;
    }
    g.start.push_back(n);
    return;
  }
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);  // max - min
  if (range < static_cast<uint64_t>(2 * n + 1024)) {
    // Dense keys: counting sort over the key range, one histogram and one scatter pass.
    std::vector<int64_t> slot(range + 1, 0);
    for (int64_t i = 0; i < n; ++i) ++slot[keys[i] - lo];
    int64_t acc = 0;
    for (uint64_t r = 0; r <= range; ++r) {
      const int64_t c = slot[r];
      if (c == 0) continue;
      g.key.push_back(lo + static_cast<int64_t>(r));
      g.start.push_back(acc);
      slot[r] = need_perm ? acc : g.size() - 1;
      acc += c;
    }
    g.start.push_back(n);
    if (need_perm) {
      g.perm.resize(n);
      for (int64_t i = 0; i < n; ++i) g.perm[slot[keys[i] - lo]++] = i;
      if (inverse)
        for (int64_t u = 0; u < g.size(); ++u)
          for (int64_t k = g.start[u]; k < g.start[u + 1]; ++k) inverse[g.perm[k]] = u;
    } else if (inverse) {
      for (int64_t i = 0; i < n; ++i) inverse[i] = slot[keys[i] - lo];
    }
    return;
  }
  const int bits = 64 - __builtin_clzll(range);
  if (bits <= 32 && n < (int64_t{1} << 31)) {
    // Sparse keys, 32-bit relative key and position packed in one word: half the traffic.
    std::vector<uint64_t> a(n);
    for (int64_t i = 0; i < n; ++i) a[i] = (static_cast<uint64_t>(keys[i] - lo) << 32) | static_cast<uint64_t>(i);
    auto key_of = [](uint64_t v) { return v >> 32; };
    if (n < 256)
      std::stable_sort(a.begin(), a.end(), [](uint64_t x, uint64_t y) { return (x >> 32) < (y >> 32); });
    else
      radix_sort(a, bits, key_of);
    groups_from_sorted(a, lo, key_of, [](uint64_t v) { return static_cast<int64_t>(v & 0xFFFFFFFFu); },
                       need_perm, inverse, g);
    return;
  }
  struct KeyPos {
    uint64_t key;
    int64_t pos;
  };
  std::vector<KeyPos> a(n);
  for (int64_t i = 0; i < n; ++i) a[i] = {static_cast<uint64_t>(keys[i]) - static_cast<uint64_t>(lo), i};
  auto key_of = [](const KeyPos& v) { return v.key; };
  if (n < 256)
    std::stable_sort(a.begin(), a.end(), [](const KeyPos& x, const KeyPos& y) { return x.key < y.key; });
  else
    radix_sort(a, bits, key_of);
  groups_from_sorted(a, lo, key_of, [](const KeyPos& v) { return v.pos; }, need_perm, inverse, g);
}

// ---- 1. packed gather + pool ------------------------------------------------------------
// First position in [begin, end) whose index is outside [0, num_rows), or -1. Kept out of the
// gather loop: a check inside it halves its speed.
int64_t first_out_of_range(const int64_t* indices, int64_t begin, int64_t end, int64_t num_rows) {
  const uint64_t limit = static_cast<uint64_t>(num_rows);
  bool any = false;
#pragma omp parallel for reduction(|| : any) if (end - begin > kParallelGrain)
  for (int64_t i = begin; i < end; ++i) any = any || static_cast<uint64_t>(indices[i]) >= limit;
  if (!any) return -1;
  for (int64_t i = begin; i < end; ++i)
    if (static_cast<uint64_t>(indices[i]) >= limit) return i;
  return -1;
}

// Pools one bag into `acc` (DIM > 0: a local array the compiler keeps in registers; DIM == 0:
// the runtime width). Indices must be valid.
template <class T, int64_t DIM>
inline void pool_bag(const T* __restrict weight, int64_t num_rows, int64_t dim, const int64_t* indices,
                        int64_t start, int64_t end, int64_t total_end, const T* psw,
                        typename Acc<T>::type* __restrict acc) {
  using A = typename Acc<T>::type;
  constexpr int64_t kPrefetch = 16;
  for (int64_t i = start; i < end; ++i) {
    // Rows are random: fetch a row a few positions ahead (across bags) to hide the miss.
    if (i + kPrefetch < total_end) {
      const int64_t rn = indices[i + kPrefetch];
      if (static_cast<uint64_t>(rn) < static_cast<uint64_t>(num_rows)) __builtin_prefetch(weight + rn * dim);
    }
    const T* row = weight + indices[i] * dim;  // bag validated by the caller
    if (psw) {
      const A a = Acc<T>::load(psw[i]);
#pragma omp simd
      for (int64_t d = 0; d < (DIM > 0 ? DIM : dim); ++d) acc[d] += a * Acc<T>::load(row[d]);
    } else {
#pragma omp simd
      for (int64_t d = 0; d < (DIM > 0 ? DIM : dim); ++d) acc[d] += Acc<T>::load(row[d]);
    }
  }
}

template <class T, int64_t DIM>
void bag_forward_impl(const T* weight, int64_t num_rows, int64_t dim_rt, const int64_t* indices,
                      int64_t num_indices, const int64_t* offsets, int64_t num_bags, Pool mode, const T* psw,
                      T* out) {
  using A = typename Acc<T>::type;
  const int64_t dim = DIM > 0 ? DIM : dim_rt;
  const int64_t total_end = std::clamp<int64_t>(offsets[num_bags], 0, num_indices);  // prefetch bound
  std::atomic<int64_t> bad{-1}, bad_bag{-1};
  const int64_t work = (offsets[num_bags] - offsets[0] + num_bags) * dim;
#pragma omp parallel if (work > kParallelGrain)
  {
    std::vector<A> acc_buf(DIM > 0 ? 0 : dim);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < num_bags; ++b) {
      const int64_t start = offsets[b], end = offsets[b + 1];
      if (start < 0 || end < start || end > num_indices) {  // offsets checked here, not in a pass
        bad_bag.store(b, std::memory_order_relaxed);
        continue;
      }
      T* o = out + b * dim;
      const bool divide = mode == Pool::Mean && end > start;
      const A n = static_cast<A>(end - start);
      // Validate the bag first (branch-free, in L1), then gather without checks.
      bool ok = true;
      for (int64_t i = start; i < end; ++i) ok &= static_cast<uint64_t>(indices[i]) < static_cast<uint64_t>(num_rows);
      if (!ok) {
        bad.store(first_out_of_range(indices, start, end, num_rows), std::memory_order_relaxed);
        continue;
      }
      if constexpr (DIM > 0) {
        A acc[DIM] = {};
        pool_bag<T, DIM>(weight, num_rows, dim, indices, start, end, total_end, psw, acc);
        for (int64_t d = 0; d < DIM; ++d) o[d] = Acc<T>::store(divide ? acc[d] / n : acc[d]);
      } else {
        A* acc = acc_buf.data();
        std::fill(acc, acc + dim, A(0));
        pool_bag<T, 0>(weight, num_rows, dim, indices, start, end, total_end, psw, acc);
        for (int64_t d = 0; d < dim; ++d) o[d] = Acc<T>::store(divide ? acc[d] / n : acc[d]);
      }
    }
  }
  const int64_t b = bad_bag.load();
  if (b >= 0) throw_bad_bag(offsets, b, num_indices);
  const int64_t pos = bad.load();
  if (pos >= 0) throw_index("index", pos, indices[pos], num_rows);
}

// Lengths-per-position: bag_of[i] = bag holding position i.
void bag_of_positions(const int64_t* offsets, int64_t num_bags, std::vector<int64_t>& bag_of) {
  const int64_t base = offsets[0];
  bag_of.resize(offsets[num_bags] - base);
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(bag_of.size()) > kParallelGrain)
  for (int64_t b = 0; b < num_bags; ++b)
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) bag_of[i - base] = b;
}

// ---- 4a. bag backward: segment-reduce over positions sorted by row (no atomics) -----------
template <class T>
int64_t bag_backward_impl(const T* grad_out, int64_t dim, const int64_t* indices, const int64_t* offsets,
                          int64_t num_bags, Pool mode, const T* psw, int64_t* rows_out, T* grads_out) {
  using A = typename Acc<T>::type;
  const int64_t base = offsets[0];
  const int64_t n = offsets[num_bags] - base;
  Groups grp;
  group_by_key(indices + base, n, /*need_perm=*/true, nullptr, grp);
  std::vector<int64_t> bag_of;
  bag_of_positions(offsets, num_bags, bag_of);
  const int64_t num_unique = grp.size();
#pragma omp parallel if (n * dim > kParallelGrain)
  {
    std::vector<A> acc(dim);
#pragma omp for schedule(static, 64)
    for (int64_t u = 0; u < num_unique; ++u) {
      rows_out[u] = grp.key[u];
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t k = grp.start[u]; k < grp.start[u + 1]; ++k) {
        const int64_t p = grp.perm[k];
        const int64_t b = bag_of[p];
        const T* g = grad_out + b * dim;
        // Same operation order as bag_backward_ref: (g / len) * w, then summed by position.
        const A len = static_cast<A>(offsets[b + 1] - offsets[b]);
        const A w = psw ? Acc<T>::load(psw[p + base]) : A(1);
        if (mode == Pool::Mean) {
          for (int64_t d = 0; d < dim; ++d) acc[d] += (Acc<T>::load(g[d]) / len) * w;
        } else if (psw) {
          for (int64_t d = 0; d < dim; ++d) acc[d] += Acc<T>::load(g[d]) * w;
        } else {
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) acc[d] += Acc<T>::load(g[d]);
        }
      }
      T* o = grads_out + u * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = Acc<T>::store(acc[d]);
    }
  }
  return num_unique;
}

// ---- 4b. sparse optimizer step ------------------------------------------------------------
template <class T>
void sparse_update_impl(T* weight, int64_t num_rows, int64_t dim, T* state, const int64_t* rows, int64_t n,
                        const T* grads, Optim opt, double lr, double eps, const int64_t* grad_index = nullptr,
                        int64_t num_grads = 0) {
  using A = typename Acc<T>::type;
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] < 0 || rows[i] >= num_rows) throw_index("row", i, rows[i], num_rows);
  if (grad_index)
    for (int64_t i = 0; i < n; ++i)
      if (grad_index[i] < 0 || grad_index[i] >= num_grads) throw_index("gradient row", i, grad_index[i], num_grads);
  Groups grp;
  group_by_key(rows, n, /*need_perm=*/true, nullptr, grp);
  const int64_t num_unique = grp.size();
  const A neg_lr = static_cast<A>(-lr);
  const A eps_a = static_cast<A>(eps);
#pragma omp parallel if (n * dim > kParallelGrain)
  {
    std::vector<A> acc(dim);
    // Each segment owns one weight row: threads never write the same row.
#pragma omp for schedule(static, 64)
    for (int64_t u = 0; u < num_unique; ++u) {
      const int64_t r = grp.key[u];
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t k = grp.start[u]; k < grp.start[u + 1]; ++k) {
        // row i's gradient: its own, or (grad_index) a shared one, e.g. its bag's
        const int64_t gi = grad_index ? grad_index[grp.perm[k]] : grp.perm[k];
        const T* g = grads + gi * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) acc[d] += Acc<T>::load(g[d]);
      }
      T* w = weight + r * dim;
      if (opt == Optim::Sgd) {
        for (int64_t d = 0; d < dim; ++d) w[d] = Acc<T>::store(Acc<T>::load(w[d]) + neg_lr * acc[d]);
      } else {
        A sq = 0;
        for (int64_t d = 0; d < dim; ++d) sq += acc[d] * acc[d];
        const A s = Acc<T>::load(state[r]) + sq / static_cast<A>(dim);
        state[r] = Acc<T>::store(s);
        const A denom = std::sqrt(Acc<T>::load(state[r])) + eps_a;
        for (int64_t d = 0; d < dim; ++d)
          w[d] = Acc<T>::store(Acc<T>::load(w[d]) + neg_lr * (acc[d] / denom));
      }
    }
  }
}

// ---- 2. routing -------------------------------------------------------------------------
template <class H>
int64_t route_ids_impl(const int64_t* ids, int64_t n, const H* hot_map, int64_t hot_map_size, int64_t num_owners,
                       int64_t* hot_pos, int64_t* hot_slot, int64_t* cold_pos, int64_t* cold_local,
                       int64_t* counts) {
  const int nthreads = n > kParallelGrain ? omp_get_max_threads() : 1;
  // Per thread: [hot count, cold count per owner...]; a counting sort by (owner, thread) keeps
  // the grouping stable because thread t handles the t-th contiguous chunk.
  const int64_t stride = num_owners + 1;
  std::vector<int64_t> cnt(static_cast<size_t>(nthreads) * stride, 0);
  std::vector<int64_t> code(n);  // hot slot (>= 0) or -(owner + 1)
  std::atomic<int64_t> bad{-1};
#pragma omp parallel num_threads(nthreads)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    int64_t* c = cnt.data() + static_cast<int64_t>(t) * stride;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t id = ids[i];
      if (id < 0 || (hot_map && id >= hot_map_size)) {
        bad.store(i, std::memory_order_relaxed);
        code[i] = -1;
        ++c[1];
        continue;
      }
      const int64_t slot = hot_map ? static_cast<int64_t>(hot_map[id]) : -1;
      if (slot >= 0) {
        code[i] = slot;
        ++c[0];
      } else {
        const int64_t owner = id % num_owners;
        code[i] = -(owner + 1);
        ++c[owner + 1];
      }
    }
#pragma omp barrier
#pragma omp single
    {
      // Exclusive prefix over (owner, thread) for cold and over thread for hot.
      int64_t hot_sum = 0, cold_sum = 0;
      for (int tt = 0; tt < nt; ++tt) {
        const int64_t h = cnt[tt * stride];
        cnt[tt * stride] = hot_sum;
        hot_sum += h;
      }
      for (int64_t o = 0; o < num_owners; ++o) {
        int64_t owner_total = 0;
        for (int tt = 0; tt < nt; ++tt) {
          const int64_t v = cnt[tt * stride + o + 1];
          cnt[tt * stride + o + 1] = cold_sum;
          cold_sum += v;
          owner_total += v;
        }
        counts[o] = owner_total;
      }
    }
    for (int64_t i = begin; i < end; ++i) {
      const int64_t k = code[i];
      if (k >= 0) {
        const int64_t at = c[0]++;
        hot_pos[at] = i;
        hot_slot[at] = k;
      } else {
        const int64_t at = c[-k]++;
        cold_pos[at] = i;
        cold_local[at] = ids[i] / num_owners;
      }
    }
  }
  const int64_t pos = bad.load();
  if (pos >= 0) throw_index("id", pos, ids[pos], hot_map ? hot_map_size : INT64_MAX);
  int64_t hot = 0;
  for (int tt = 0; tt < nthreads; ++tt) hot = std::max(hot, cnt[tt * stride]);
  return hot;
}

// ---- 2b. per-bag owner counts (the pooled exchange's lengths) ----------------------------
template <class H>
void bag_owner_counts_impl(const int64_t* ids, int64_t n, const int64_t* offsets, int64_t num_bags, const H* hot_map,
                           int64_t hot_map_size, int64_t num_owners, int64_t* counts) {
  std::fill(counts, counts + (num_owners + 1) * num_bags, int64_t{0});
  std::atomic<int64_t> bad{-1}, bad_bag{-1};
  // Each bag writes only its own column, so bags split across threads without conflicts.
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t b = 0; b < num_bags; ++b) {
    const int64_t start = offsets[b], end = offsets[b + 1];
    if (start < 0 || end < start || end > n) {
      bad_bag.store(b, std::memory_order_relaxed);
      continue;
    }
    int64_t* col = counts + b;
    for (int64_t i = start; i < end; ++i) {
      const int64_t id = ids[i];
      if (id < 0 || (hot_map && id >= hot_map_size)) {
        bad.store(i, std::memory_order_relaxed);
        break;
      }
      const int64_t row = (hot_map && hot_map[id] >= 0) ? num_owners : id % num_owners;
      ++col[row * num_bags];
    }
  }
  const int64_t b = bad_bag.load();
  if (b >= 0) throw_bad_bag(offsets, b, n);
  const int64_t pos = bad.load();
  if (pos >= 0) throw_index("id", pos, ids[pos], hot_map ? hot_map_size : INT64_MAX);
}

}  // namespace

void bag_forward(DType dt, const void* weight, int64_t num_rows, int64_t dim, const int64_t* indices,
                 int64_t num_indices, const int64_t* offsets, int64_t num_bags, Pool mode, const void* psw,
                 void* out) {
  dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* w = static_cast<const T*>(weight);
    const T* p = static_cast<const T*>(psw);
    T* o = static_cast<T*>(out);
    if constexpr (std::is_same_v<T, float>) {
      // Fixed widths let the compiler unroll the row loop into a few vector loads.
      switch (dim) {
        case 8:
          return bag_forward_impl<T, 8>(w, num_rows, dim, indices, num_indices, offsets, num_bags, mode, p, o);
        case 16:
          return bag_forward_impl<T, 16>(w, num_rows, dim, indices, num_indices, offsets, num_bags, mode, p, o);
        case 32:
          return bag_forward_impl<T, 32>(w, num_rows, dim, indices, num_indices, offsets, num_bags, mode, p, o);
        case 64:
          return bag_forward_impl<T, 64>(w, num_rows, dim, indices, num_indices, offsets, num_bags, mode, p, o);
        case 128:
          return bag_forward_impl<T, 128>(w, num_rows, dim, indices, num_indices, offsets, num_bags, mode, p, o);
        default:
          break;
      }
    }
    bag_forward_impl<T, 0>(w, num_rows, dim, indices, num_indices, offsets, num_bags, mode, p, o);
  });
}

int64_t bag_backward(DType dt, const void* grad_out, int64_t dim, const int64_t* indices, const int64_t* offsets,
                     int64_t num_bags, Pool mode, const void* psw, int64_t* rows_out, void* grads_out) {
  int64_t u = 0;
  dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    u = bag_backward_impl<T>(static_cast<const T*>(grad_out), dim, indices, offsets, num_bags, mode,
                             static_cast<const T*>(psw), rows_out, static_cast<T*>(grads_out));
  });
  return u;
}

int64_t unique(const int64_t* ids, int64_t n, int64_t* uniq, int64_t* inverse, int64_t* counts) {
  Groups grp;
  group_by_key(ids, n, /*need_perm=*/false, inverse, grp);
  for (int64_t u = 0; u < grp.size(); ++u) {
    uniq[u] = grp.key[u];
    counts[u] = grp.start[u + 1] - grp.start[u];
  }
  return grp.size();
}

int64_t route_ids(const int64_t* ids, int64_t n, const void* hot_map, bool hot_map_is_int32,
                  int64_t hot_map_size, int64_t num_owners, int64_t* hot_pos, int64_t* hot_slot,
                  int64_t* cold_pos, int64_t* cold_local, int64_t* counts) {
  if (num_owners < 1) throw std::invalid_argument("picasso native: num_owners must be >= 1");
  if (hot_map_is_int32)
    return route_ids_impl(ids, n, static_cast<const int32_t*>(hot_map), hot_map_size, num_owners, hot_pos,
                          hot_slot, cold_pos, cold_local, counts);
  return route_ids_impl(ids, n, static_cast<const int64_t*>(hot_map), hot_map_size, num_owners, hot_pos,
                        hot_slot, cold_pos, cold_local, counts);
}

void bag_owner_counts(const int64_t* ids, int64_t n, const int64_t* offsets, int64_t num_bags, const void* hot_map,
                      bool hot_map_is_int32, int64_t hot_map_size, int64_t num_owners, int64_t* counts) {
  if (num_owners < 1) throw std::invalid_argument("picasso native: num_owners must be >= 1");
  if (hot_map_is_int32)
    return bag_owner_counts_impl(ids, n, offsets, num_bags, static_cast<const int32_t*>(hot_map), hot_map_size,
                                 num_owners, counts);
  bag_owner_counts_impl(ids, n, offsets, num_bags, static_cast<const int64_t*>(hot_map), hot_map_size, num_owners,
                        counts);
}

void sparse_update(DType dt, void* weight, int64_t num_rows, int64_t dim, void* state, const int64_t* rows,
                   int64_t n, const void* grads, Optim opt, double lr, double eps) {
  dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    sparse_update_impl<T>(static_cast<T*>(weight), num_rows, dim, static_cast<T*>(state), rows, n,
                          static_cast<const T*>(grads), opt, lr, eps);
  });
}

void sparse_update_indexed(DType dt, void* weight, int64_t num_rows, int64_t dim, void* state, const int64_t* rows,
                           int64_t n, const void* grads, int64_t num_grads, const int64_t* grad_index, Optim opt,
                           double lr, double eps) {
  dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    sparse_update_impl<T>(static_cast<T*>(weight), num_rows, dim, static_cast<T*>(state), rows, n,
                          static_cast<const T*>(grads), opt, lr, eps, grad_index, num_grads);
  });
}

}  // namespace cpu
}  // namespace picasso
