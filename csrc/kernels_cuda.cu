// CUDA kernels of the embedding hot path. No torch headers: raw device pointers, temporaries from
// the binding's allocator (torch's caching allocator), work queued on the caller's stream.
//
// Design: the gather gives each bag a group of L lanes (L = vector slots per row, a power of two
// <= 32) so one-hot bags do not idle a warp, with float4 loads when rows are 16-byte aligned.
// Everything that groups IDs (unique, bag backward, sparse update, routing) sorts (key, position)
// pairs with cub's stable radix sort and then works on contiguous segments: no atomics on
// embedding rows, and sums run in position order like the reference.
#ifndef PICASSO_WITH_CUDA
#define PICASSO_WITH_CUDA
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace picasso {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("picasso cuda: ") + what + ": " + cudaGetErrorString(err));
}

// Device temporaries released when the scope ends (stream-ordered in torch's allocator).
class Buffer {
 public:
  Buffer(const Allocator& mem, size_t bytes) : mem_(mem) {
    if (bytes) ptr_ = mem_.alloc(bytes, mem_.ctx);
  }
  ~Buffer() {
    if (ptr_) mem_.release(ptr_, mem_.ctx);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void* get() const { return ptr_; }

 private:
  const Allocator& mem_;
  void* ptr_ = nullptr;
};

inline unsigned blocks_for(int64_t threads) {
  return static_cast<unsigned>((threads + kThreads - 1) / kThreads);
}

template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};

__device__ inline float to_acc(float v) { return v; }
__device__ inline double to_acc(double v) { return v; }
__device__ inline float to_acc(__half v) { return __half2float(v); }
__device__ inline float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ inline T from_acc(typename AccOf<T>::type v);
template <>
__device__ inline float from_acc<float>(float v) {
  return v;
}
template <>
__device__ inline double from_acc<double>(double v) {
  return v;
}
template <>
__device__ inline __half from_acc<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Records the first bad position seen (any one is enough for the error message).
__device__ inline void flag_error(int64_t* error_flag, int64_t pos) {
  atomicCAS(reinterpret_cast<unsigned long long*>(error_flag), static_cast<unsigned long long>(-1),
            static_cast<unsigned long long>(pos));
}

// ---- 1. packed gather + pool: a group of L lanes per bag, V elements per lane per load ------
template <class T, int V>
__global__ void bag_forward_kernel(const T* __restrict__ weight, int64_t num_rows, int64_t dim,
                                   const int64_t* __restrict__ indices, const int64_t* __restrict__ offsets,
                                   int64_t num_bags, int mean, const T* __restrict__ psw, T* __restrict__ out,
                                   int lanes_log2, int64_t* error_flag) {
  using A = typename AccOf<T>::type;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t b = t >> lanes_log2;
  if (b >= num_bags) return;
  const int lanes = 1 << lanes_log2;
  const int lane = static_cast<int>(t & (lanes - 1));
  const int64_t start = offsets[b], end = offsets[b + 1];
  for (int64_t c = static_cast<int64_t>(lane) * V; c < dim; c += static_cast<int64_t>(lanes) * V) {
    A acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = A(0);
#pragma unroll 4
    for (int64_t i = start; i < end; ++i) {
      const int64_t r = __ldg(indices + i);
      if (r < 0 || r >= num_rows) {
        flag_error(error_flag, i);
        continue;
      }
      const A a = psw ? to_acc(psw[i]) : A(1);
      const T* row = weight + r * dim + c;
      if constexpr (V == 4) {
        const float4 x = __ldg(reinterpret_cast<const float4*>(row));
        acc[0] += a * x.x;
        acc[1] += a * x.y;
        acc[2] += a * x.z;
        acc[3] += a * x.w;
      } else {
        acc[0] += a * to_acc(row[0]);
      }
    }
    T* o = out + b * dim + c;
    if constexpr (V == 4) {
      // Division (not multiplication by 1/n) for mean, to round like the reference.
      const A n = static_cast<A>(end - start);
      const bool div = mean && end > start;
      *reinterpret_cast<float4*>(o) = make_float4(div ? acc[0] / n : acc[0], div ? acc[1] / n : acc[1],
                                                  div ? acc[2] / n : acc[2], div ? acc[3] / n : acc[3]);
    } else {
      const A n = static_cast<A>(end - start);
      o[0] = from_acc<T>((mean && end > start) ? acc[0] / n : acc[0]);
    }
  }
}

int lanes_log2_for(int64_t slots) {
  int l = 0;
  while ((int64_t{1} << l) < slots && l < 5) ++l;
  return l;
}

template <class T>
void launch_bag_forward(const T* weight, int64_t num_rows, int64_t dim, const int64_t* indices,
                        const int64_t* offsets, int64_t num_bags, Pool mode, const T* psw, T* out,
                        int64_t* error_flag, cudaStream_t s) {
  if (num_bags == 0 || dim == 0) return;
  const int mean = mode == Pool::Mean;
  if constexpr (std::is_same<T, float>::value) {
    // float4 loads when every row starts on a 16-byte boundary.
    if (dim % 4 == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
      const int l2 = lanes_log2_for(dim / 4);
      bag_forward_kernel<T, 4><<<blocks_for(num_bags << l2), kThreads, 0, s>>>(
          weight, num_rows, dim, indices, offsets, num_bags, mean, psw, out, l2, error_flag);
      check(cudaGetLastError(), "bag_forward launch");
      return;
    }
  }
  const int l2 = lanes_log2_for(dim);
  bag_forward_kernel<T, 1><<<blocks_for(num_bags << l2), kThreads, 0, s>>>(weight, num_rows, dim, indices, offsets,
                                                                           num_bags, mean, psw, out, l2, error_flag);
  check(cudaGetLastError(), "bag_forward launch");
}

// ---- grouping: stable sort of (key, position), then segment heads -----------------------
__global__ void iota_kernel(int64_t* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

__global__ void head_kernel(const int64_t* keys, int64_t n, int64_t* head) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) head[i] = (i == 0 || keys[i] != keys[i - 1]) ? 1 : 0;
}

// seg[i] (inclusive scan of heads) - 1 is the group of sorted element i.
__global__ void groups_kernel(const int64_t* keys, const int64_t* seg, const int64_t* pos, int64_t n,
                              int64_t* group_key, int64_t* group_start, int64_t* inverse, int64_t* num_groups) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t u = seg[i] - 1;
  if (i == 0 || keys[i] != keys[i - 1]) {
    group_key[u] = keys[i];
    group_start[u] = i;
  }
  if (inverse) inverse[pos[i]] = u;
  if (i == n - 1) {
    group_start[u + 1] = n;
    *num_groups = u + 1;
  }
}

struct Grouped {
  Buffer sorted_keys, perm, group_key, group_start, num_groups;
  Grouped(const Allocator& mem, int64_t n)
      : sorted_keys(mem, n * 8),
        perm(mem, n * 8),
        group_key(mem, n * 8),
        group_start(mem, (n + 1) * 8),
        num_groups(mem, 8) {}
};

void check_size(int64_t n) {
  if (n > INT_MAX) throw std::invalid_argument("picasso cuda: more than 2^31 - 1 ids in one call");
}

int64_t read_scalar(const int64_t* dev, cudaStream_t s);

// OR of all keys: its highest set bit bounds the bits a radix sort must look at.
__global__ void key_or_kernel(const int64_t* __restrict__ keys, int64_t n, unsigned long long* out) {
  unsigned long long v = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    v |= static_cast<unsigned long long>(keys[i]);
  for (int off = 16; off > 0; off >>= 1) v |= __shfl_xor_sync(kFullMask, v, off);
  if ((threadIdx.x & 31) == 0 && v) atomicOr(out, v);
}

int bits_for(unsigned long long v) {  // bits to sort keys whose OR is v (negative keys: all 64)
  int b = 1;
  while (b < 64 && (v >> b) != 0) ++b;
  return b;
}

// Bits that hold every key (one pass and one read back: a 64-bit sort of small keys would
// spend most of its passes on zero digits).
int key_bits(const int64_t* keys, int64_t n, const Allocator& mem, cudaStream_t s) {
  Buffer acc(mem, 8);
  check(cudaMemsetAsync(acc.get(), 0, 8, s), "memset");
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks_for(n), 1024));
  key_or_kernel<<<grid, kThreads, 0, s>>>(keys, n, acc.as<unsigned long long>());
  check(cudaGetLastError(), "key bits");
  return bits_for(static_cast<unsigned long long>(read_scalar(acc.as<int64_t>(), s)));
}

// Groups n int64 keys: perm (positions sorted by key, stable), group keys/starts, the group
// count on the device, and inverse[i] when inverse is not null. `end_bit` bounds the keys'
// bits where the caller knows it (0: measured here); keys outside it must be flagged by the
// caller as errors, since they do not sort.
void group_keys(const int64_t* keys, int64_t n, Grouped& g, int64_t* inverse, const Allocator& mem,
                cudaStream_t s, int end_bit = 0) {
  check_size(n);
  if (end_bit <= 0) end_bit = key_bits(keys, n, mem, s);
  Buffer positions(mem, n * 8);
  iota_kernel<<<blocks_for(n), kThreads, 0, s>>>(positions.as<int64_t>(), n);
  size_t temp = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, temp, keys, g.sorted_keys.as<int64_t>(), positions.as<int64_t>(),
                                        g.perm.as<int64_t>(), static_cast<int>(n), 0, end_bit, s),
        "sort size");
  {
    Buffer scratch(mem, temp);
    check(cub::DeviceRadixSort::SortPairs(scratch.get(), temp, keys, g.sorted_keys.as<int64_t>(),
                                          positions.as<int64_t>(), g.perm.as<int64_t>(), static_cast<int>(n), 0, end_bit,
                                          s),
          "sort");
  }
  Buffer head(mem, n * 8), seg(mem, n * 8);
  head_kernel<<<blocks_for(n), kThreads, 0, s>>>(g.sorted_keys.as<int64_t>(), n, head.as<int64_t>());
  temp = 0;
  check(cub::DeviceScan::InclusiveSum(nullptr, temp, head.as<int64_t>(), seg.as<int64_t>(), static_cast<int>(n), s),
        "scan size");
  {
    Buffer scratch(mem, temp);
    check(cub::DeviceScan::InclusiveSum(scratch.get(), temp, head.as<int64_t>(), seg.as<int64_t>(),
                                        static_cast<int>(n), s),
          "scan");
  }
  groups_kernel<<<blocks_for(n), kThreads, 0, s>>>(g.sorted_keys.as<int64_t>(), seg.as<int64_t>(),
                                                   g.perm.as<int64_t>(), n, g.group_key.as<int64_t>(),
                                                   g.group_start.as<int64_t>(), inverse, g.num_groups.as<int64_t>());
  check(cudaGetLastError(), "group kernels");
}

int64_t read_scalar(const int64_t* dev, cudaStream_t s) {
  int64_t host = 0;
  check(cudaMemcpyAsync(&host, dev, sizeof(host), cudaMemcpyDeviceToHost, s), "copy to host");
  check(cudaStreamSynchronize(s), "synchronize");
  return host;
}

__global__ void counts_kernel(const int64_t* group_start, const int64_t* num_groups, int64_t n, int64_t* counts) {
  const int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u < n && u < *num_groups) counts[u] = group_start[u + 1] - group_start[u];
}

// ---- 4a. bag backward: one warp per distinct row, lanes over columns -------------------------
__global__ void bag_of_kernel(const int64_t* offsets, int64_t num_bags, int64_t n, int64_t* bag_of) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= n) return;
  // Last bag whose start is <= the absolute position (empty bags are skipped naturally).
  const int64_t target = offsets[0] + p;
  int64_t lo = 0, hi = num_bags;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (offsets[mid] <= target)
      lo = mid;
    else
      hi = mid;
  }
  bag_of[p] = lo;
}

template <class T>
__global__ void bag_backward_kernel(const T* __restrict__ grad, int64_t dim, const int64_t* __restrict__ offsets,
                                    const int64_t* __restrict__ perm, const int64_t* __restrict__ group_start,
                                    const int64_t* __restrict__ num_groups, const int64_t* __restrict__ bag_of,
                                    const T* __restrict__ psw, int mean, T* __restrict__ out) {
  using A = typename AccOf<T>::type;
  const int64_t u = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (u >= *num_groups) return;
  const int64_t s = group_start[u], e = group_start[u + 1];
  for (int64_t c = lane; c < dim; c += 32) {
    A acc = A(0);
    for (int64_t k = s; k < e; ++k) {
      const int64_t p = perm[k];
      const int64_t b = bag_of[p];
      A v = to_acc(grad[b * dim + c]);
      if (mean) v = v / static_cast<A>(offsets[b + 1] - offsets[b]);
      if (psw) v = v * to_acc(psw[p]);
      acc += v;
    }
    out[u * dim + c] = from_acc<T>(acc);
  }
}

// ---- 4b. sparse update: one warp per distinct row -----------------------------------------
template <class T>
__global__ void sparse_update_kernel(T* __restrict__ weight, int64_t num_rows, int64_t dim, T* __restrict__ state,
                                     const int64_t* __restrict__ group_key, const int64_t* __restrict__ perm,
                                     const int64_t* __restrict__ group_start, const int64_t* __restrict__ num_groups,
                                     const T* __restrict__ grads, int adagrad, double lr, double eps,
                                     typename AccOf<T>::type* __restrict__ summed, int64_t* error_flag) {
  using A = typename AccOf<T>::type;
  const int64_t u = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (u >= *num_groups) return;
  const int64_t r = group_key[u];
  if (r < 0 || r >= num_rows) {
    if (lane == 0) flag_error(error_flag, perm[group_start[u]]);
    return;
  }
  const int64_t s = group_start[u], e = group_start[u + 1];
  const A neg_lr = static_cast<A>(-lr);
  T* w = weight + r * dim;
  A sq = A(0);
  for (int64_t c = lane; c < dim; c += 32) {
    A acc = A(0);
    for (int64_t k = s; k < e; ++k) acc += to_acc(grads[perm[k] * dim + c]);
    if (adagrad) {
      summed[u * dim + c] = acc;  // read back below by this same lane
      sq += acc * acc;
    } else {
      w[c] = from_acc<T>(to_acc(w[c]) + neg_lr * acc);
    }
  }
  if (!adagrad) return;
  for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(kFullMask, sq, off);
  const A updated = to_acc(state[r]) + sq / static_cast<A>(dim);
  const T stored = from_acc<T>(updated);
  __syncwarp();
  if (lane == 0) state[r] = stored;
  const A denom = sqrt(to_acc(stored)) + static_cast<A>(eps);
  for (int64_t c = lane; c < dim; c += 32) w[c] = from_acc<T>(to_acc(w[c]) + neg_lr * (summed[u * dim + c] / denom));
}

// ---- 2. routing: bucket 0 = hot, bucket 1 + owner = cold; stable sort by bucket ------------
template <class H>
__global__ void classify_kernel(const int64_t* __restrict__ ids, int64_t n, const H* __restrict__ hot_map,
                                int64_t hot_map_size, int64_t num_owners, uint32_t* __restrict__ bucket,
                                int64_t* __restrict__ slot, unsigned long long* __restrict__ counts,
                                int64_t* error_flag) {
  extern __shared__ unsigned long long local[];
  const bool shared_hist = num_owners + 1 <= 2048;
  if (shared_hist) {
    for (int64_t k = threadIdx.x; k <= num_owners; k += blockDim.x) local[k] = 0;
    __syncthreads();
  }
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const int64_t id = ids[i];
    int64_t sl = -1;
    uint32_t k = 1;
    if (id < 0 || (hot_map && id >= hot_map_size)) {
      flag_error(error_flag, i);
    } else {
      sl = hot_map ? static_cast<int64_t>(hot_map[id]) : -1;
      k = sl >= 0 ? 0u : static_cast<uint32_t>(1 + id % num_owners);
    }
    bucket[i] = k;
    slot[i] = sl;
    if (shared_hist)
      atomicAdd(&local[k], 1ull);
    else
      atomicAdd(&counts[k], 1ull);
  }
  if (shared_hist) {
    __syncthreads();
    for (int64_t k = threadIdx.x; k <= num_owners; k += blockDim.x)
      if (local[k]) atomicAdd(&counts[k], local[k]);
  }
}

__global__ void route_scatter_kernel(const int64_t* __restrict__ ids, const int64_t* __restrict__ sorted_pos,
                                     const int64_t* __restrict__ slot, int64_t n, int64_t hot, int64_t num_owners,
                                     int64_t* hot_pos, int64_t* hot_slot, int64_t* cold_pos, int64_t* cold_local) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const int64_t p = sorted_pos[k];
  if (k < hot) {
    hot_pos[k] = p;
    hot_slot[k] = slot[p];
  } else {
    cold_pos[k - hot] = p;
    cold_local[k - hot] = ids[p] / num_owners;
  }
}

template <class F>
void dispatch(DType dt, F&& f) {
  switch (dt) {
    case DType::F32:
      return f(static_cast<float*>(nullptr));
    case DType::F64:
      return f(static_cast<double*>(nullptr));
    case DType::F16:
      return f(static_cast<__half*>(nullptr));
    case DType::BF16:
      return f(static_cast<__nv_bfloat16*>(nullptr));
  }
  throw std::invalid_argument("picasso cuda: unsupported dtype");
}

void throw_if_flagged(const int64_t* error_flag, cudaStream_t s, const char* what) {
  const int64_t pos = read_scalar(error_flag, s);
  if (pos >= 0)
    throw std::out_of_range(std::string("picasso cuda: ") + what + " at position " + std::to_string(pos) +
                            " is out of range");
}

}  // namespace

void bag_forward(DType dt, const void* weight, int64_t num_rows, int64_t dim, const int64_t* indices,
                 const int64_t* offsets, int64_t num_bags, Pool mode, const void* psw, void* out,
                 int64_t* error_flag, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_bag_forward<T>(static_cast<const T*>(weight), num_rows, dim, indices, offsets, num_bags, mode,
                          static_cast<const T*>(psw), static_cast<T*>(out), error_flag, s);
  });
}

int64_t unique(const int64_t* ids, int64_t n, int64_t* uniq, int64_t* inverse, int64_t* counts,
               const Allocator& mem, void* stream) {
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  Grouped g(mem, n);
  group_keys(ids, n, g, inverse, mem, s);
  counts_kernel<<<blocks_for(n), kThreads, 0, s>>>(g.group_start.as<int64_t>(), g.num_groups.as<int64_t>(), n,
                                                    counts);
  check(cudaGetLastError(), "counts kernel");
  const int64_t u = read_scalar(g.num_groups.as<int64_t>(), s);
  check(cudaMemcpyAsync(uniq, g.group_key.get(), u * 8, cudaMemcpyDeviceToDevice, s), "copy unique");
  return u;
}

int64_t bag_backward(DType dt, const void* grad_out, int64_t dim, const int64_t* indices, const int64_t* offsets,
                     int64_t num_bags, int64_t num_indices, Pool mode, const void* psw, int64_t* rows_out,
                     void* grads_out, const Allocator& mem, void* stream) {
  // num_indices = offsets[num_bags] - offsets[0], read by the binding; indices start at offsets[0].
  if (num_indices == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  Grouped g(mem, num_indices);
  group_keys(indices, num_indices, g, nullptr, mem, s);
  Buffer bag_of(mem, num_indices * 8);
  bag_of_kernel<<<blocks_for(num_indices), kThreads, 0, s>>>(offsets, num_bags, num_indices, bag_of.as<int64_t>());
  dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bag_backward_kernel<T><<<blocks_for(num_indices * 32), kThreads, 0, s>>>(
        static_cast<const T*>(grad_out), dim, offsets, g.perm.as<int64_t>(), g.group_start.as<int64_t>(),
        g.num_groups.as<int64_t>(), bag_of.as<int64_t>(), static_cast<const T*>(psw), mode == Pool::Mean,
        static_cast<T*>(grads_out));
  });
  check(cudaGetLastError(), "bag_backward kernels");
  const int64_t u = read_scalar(g.num_groups.as<int64_t>(), s);
  check(cudaMemcpyAsync(rows_out, g.group_key.get(), u * 8, cudaMemcpyDeviceToDevice, s), "copy rows");
  return u;
}

int64_t route_ids(const int64_t* ids, int64_t n, const void* hot_map, bool hot_map_is_int32, int64_t hot_map_size,
                  int64_t num_owners,
                  int64_t* hot_pos, int64_t* hot_slot, int64_t* cold_pos, int64_t* cold_local, int64_t* counts,
                  const Allocator& mem, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  check_size(n);
  Buffer all_counts(mem, (num_owners + 1) * 8), error_flag(mem, 8);
  check(cudaMemsetAsync(all_counts.get(), 0, (num_owners + 1) * 8, s), "memset");
  check(cudaMemsetAsync(error_flag.get(), 0xFF, 8, s), "memset");
  if (n > 0) {
    Buffer bucket(mem, n * 4), sorted_bucket(mem, n * 4), slot(mem, n * 8), positions(mem, n * 8),
        sorted_pos(mem, n * 8);
    const size_t shared = num_owners + 1 <= 2048 ? (num_owners + 1) * sizeof(unsigned long long) : 0;
    auto* cnt = all_counts.as<unsigned long long>();
    if (hot_map_is_int32)
      classify_kernel<int32_t><<<blocks_for(n), kThreads, shared, s>>>(
          ids, n, static_cast<const int32_t*>(hot_map), hot_map_size, num_owners, bucket.as<uint32_t>(),
          slot.as<int64_t>(), cnt, error_flag.as<int64_t>());
    else
      classify_kernel<int64_t><<<blocks_for(n), kThreads, shared, s>>>(
          ids, n, static_cast<const int64_t*>(hot_map), hot_map_size, num_owners, bucket.as<uint32_t>(),
          slot.as<int64_t>(), cnt, error_flag.as<int64_t>());
    check(cudaGetLastError(), "classify kernel");
    iota_kernel<<<blocks_for(n), kThreads, 0, s>>>(positions.as<int64_t>(), n);
    int end_bit = 1;
    while ((int64_t{1} << end_bit) <= num_owners) ++end_bit;
    size_t temp = 0;
    check(cub::DeviceRadixSort::SortPairs(nullptr, temp, bucket.as<uint32_t>(), sorted_bucket.as<uint32_t>(),
                                          positions.as<int64_t>(), sorted_pos.as<int64_t>(), static_cast<int>(n), 0,
                                          end_bit, s),
          "sort size");
    {
      Buffer scratch(mem, temp);
      check(cub::DeviceRadixSort::SortPairs(scratch.get(), temp, bucket.as<uint32_t>(), sorted_bucket.as<uint32_t>(),
                                            positions.as<int64_t>(), sorted_pos.as<int64_t>(), static_cast<int>(n), 0,
                                            end_bit, s),
            "sort");
    }
    throw_if_flagged(error_flag.as<int64_t>(), s, "id");
    const int64_t hot = read_scalar(all_counts.as<int64_t>(), s);
    route_scatter_kernel<<<blocks_for(n), kThreads, 0, s>>>(ids, sorted_pos.as<int64_t>(), slot.as<int64_t>(), n,
                                                            hot, num_owners, hot_pos, hot_slot, cold_pos,
                                                            cold_local);
    check(cudaGetLastError(), "route scatter");
    check(cudaMemcpyAsync(counts, all_counts.as<int64_t>() + 1, num_owners * 8, cudaMemcpyDeviceToDevice, s),
          "copy counts");
    return hot;
  }
  check(cudaMemcpyAsync(counts, all_counts.as<int64_t>() + 1, num_owners * 8, cudaMemcpyDeviceToDevice, s),
        "copy counts");
  return 0;
}

void sparse_update(DType dt, void* weight, int64_t num_rows, int64_t dim, void* state, const int64_t* rows,
                   int64_t n, const void* grads, Optim opt, double lr, double eps, const Allocator& mem,
                   void* stream) {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  Grouped g(mem, n);
  // rows lie in [0, num_rows): the sort needs only their bits (others are flagged below)
  group_keys(rows, n, g, nullptr, mem, s, bits_for(static_cast<unsigned long long>(std::max<int64_t>(num_rows - 1, 1))));
  Buffer error_flag(mem, 8);
  check(cudaMemsetAsync(error_flag.get(), 0xFF, 8, s), "memset");
  dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename AccOf<T>::type;
    Buffer summed(mem, opt == Optim::RowwiseAdagrad ? n * dim * sizeof(A) : 0);
    sparse_update_kernel<T><<<blocks_for(n * 32), kThreads, 0, s>>>(
        static_cast<T*>(weight), num_rows, dim, static_cast<T*>(state), g.group_key.as<int64_t>(),
        g.perm.as<int64_t>(), g.group_start.as<int64_t>(), g.num_groups.as<int64_t>(), static_cast<const T*>(grads),
        opt == Optim::RowwiseAdagrad, lr, eps, summed.as<A>(), error_flag.as<int64_t>());
    check(cudaGetLastError(), "sparse_update kernel");
  });
  throw_if_flagged(error_flag.as<int64_t>(), s, "row");
}

}  // namespace cuda
}  // namespace picasso
