// Native kernels of the embedding hot path, declared without torch headers.
//
// They live in kernels_cpu.cpp (plain C++ + OpenMP) and serve the CPU (the GPU's embedding
// kernels are Triton, in executor/sparse); binding.cpp is the only file that sees torch.
// Conventions follow executor/sparse/kernels.py: `indices` are packed rows of `weight`, `offsets`
// has num_bags + 1 entries (CSR), all index arrays are int64. Errors are reported by
// throwing std::invalid_argument / std::out_of_range outside of any parallel region.
#pragma once

#include <cstddef>
#include <cstdint>

namespace picasso {

enum class DType : int { F32 = 0, F64 = 1, F16 = 2, BF16 = 3 };
enum class Pool : int { Sum = 0, Mean = 1 };
enum class Optim : int { Sgd = 0, RowwiseAdagrad = 1 };

namespace cpu {

// out[b] = pool over i in [offsets[b], offsets[b+1]) of psw[i] * weight[indices[i]];
// fp16/bf16 accumulate in fp32. psw may be null. Offsets and indices are range-checked.
void bag_forward(DType dt, const void* weight, int64_t num_rows, int64_t dim, const int64_t* indices,
                 int64_t num_indices, const int64_t* offsets, int64_t num_bags, Pool mode, const void* psw,
                 void* out);

// Sparse gradient of bag_forward: rows_out[0:U] = unique indices ascending, grads_out[u] the sum
// of the (scaled) grad_out rows of every occurrence. Buffers hold num_indices entries; returns U.
int64_t bag_backward(DType dt, const void* grad_out, int64_t dim, const int64_t* indices,
                     const int64_t* offsets, int64_t num_bags, Pool mode, const void* psw,
                     int64_t* rows_out, void* grads_out);

// Sorted unique with inverse and counts; uniq/counts hold n entries; returns U.
int64_t unique(const int64_t* ids, int64_t n, int64_t* uniq, int64_t* inverse, int64_t* counts);

// Hot/cold split and owner grouping of route_ids_ref. hot_map (int32 if hot_map_is_int32,
// else int64; may be null) has hot_map_size entries. hot_pos/hot_slot/cold_pos/cold_local hold n
// entries, counts num_owners. Returns the number of hot IDs (cold = n - hot).
int64_t route_ids(const int64_t* ids, int64_t n, const void* hot_map, bool hot_map_is_int32,
                  int64_t hot_map_size, int64_t num_owners, int64_t* hot_pos, int64_t* hot_slot,
                  int64_t* cold_pos, int64_t* cold_local, int64_t* counts);

// Per bag of the CSR (offsets: num_bags + 1), how many of its IDs are cold for each owner
// (owner = id % num_owners) and how many are hot (hot_map[id] >= 0, hot_map as in route_ids):
// counts [(num_owners + 1) * num_bags], row o = owner o, row num_owners = hot.
void bag_owner_counts(const int64_t* ids, int64_t n, const int64_t* offsets, int64_t num_bags, const void* hot_map,
                      bool hot_map_is_int32, int64_t hot_map_size, int64_t num_owners, int64_t* counts);

// In-place SGD / row-wise Adagrad after summing duplicate rows (sparse_update_ref semantics).
// state (same dtype as weight, one value per row) is only read for RowwiseAdagrad.
void sparse_update(DType dt, void* weight, int64_t num_rows, int64_t dim, void* state, const int64_t* rows,
                   int64_t n, const void* grads, Optim opt, double lr, double eps);
// The same with row i's gradient at grads[grad_index[i]] (num_grads rows): gradients shared by
// several rows (a pooled bag's, by each of its lookups) are read in place, never expanded.
void sparse_update_indexed(DType dt, void* weight, int64_t num_rows, int64_t dim, void* state, const int64_t* rows,
                           int64_t n, const void* grads, int64_t num_grads, const int64_t* grad_index, Optim opt,
                           double lr, double eps);

// DLRM dot interaction (interaction_cpu.cpp): rows[0..f) are f row-major [n, d] fp32 inputs; out
// [n, d + f(f-1)/2] gets rows[0] then the dot products of inputs i > j, pair (i, j) at
// i(i-1)/2 + j. The backward writes each input's gradient [n, d] to grads[i] from grad [n, width].
void dot_interaction_forward(const float* const* rows, int64_t f, int64_t d, int64_t n, float* out);
void dot_interaction_backward(const float* grad, const float* const* rows, int64_t f, int64_t d, int64_t n,
                              float* const* grads);

}  // namespace cpu


}  // namespace picasso
