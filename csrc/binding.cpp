// Python binding of the native kernels: checks arguments, allocates outputs with torch and calls
// the torch-free kernels of kernels_cpu.cpp. CPU tensors only: the GPU's kernels are Triton.
// Every tensor's device and every index tensor's dtype is checked before any data is read, and
// every error leaves the module as one of pybind11's own Python exceptions (`guarded`): the
// module never relies on torch's exception translators, which a CUDA build of torch did not
// reach (the process died on a C++ exception instead).
#include <torch/extension.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "binding.h"
#include "kernels.h"

namespace picasso {

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::F32;
    case at::kDouble:
      return DType::F64;
    case at::kHalf:
      return DType::F16;
    case at::kBFloat16:
      return DType::BF16;
    default:
      TORCH_CHECK_TYPE(false, "picasso native: expected a floating tensor, got ", t.scalar_type());
  }
}

Pool pool_of(const std::string& mode) {
  if (mode == "sum") return Pool::Sum;
  if (mode == "mean") return Pool::Mean;
  TORCH_CHECK_VALUE(false, "picasso native: mode must be 'sum' or 'mean', got '", mode, "'");
}

Optim optim_of(const std::string& name) {
  if (name == "sgd") return Optim::Sgd;
  if (name == "rowwise_adagrad") return Optim::RowwiseAdagrad;
  TORCH_CHECK_VALUE(false, "unknown sparse optimizer '", name, "'");
}

at::Tensor as_long(const at::Tensor& t) { return t.to(at::kLong).contiguous(); }

namespace {

void require_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), "picasso native: runs on CPU tensors, got ", name, " on ", t.device());
}

void require_cpu(const std::optional<at::Tensor>& t, const char* name) {
  if (t) require_cpu(*t, name);
}

// IDs, rows and offsets: CPU tensors of an integer dtype (a float ID would be truncated silently).
void require_ids(const at::Tensor& t, const char* name) {
  require_cpu(t, name);
  TORCH_CHECK_TYPE(at::isIntegralType(t.scalar_type(), /*includeBool=*/false), "picasso native: ", name,
                   " must be an integer tensor, got ", t.scalar_type());
}

void require_ids(const std::optional<at::Tensor>& t, const char* name) {
  if (t) require_ids(*t, name);
}

// Offsets are CSR: non-decreasing, starting at >= 0 and ending inside indices.
void check_offsets_cpu(const at::Tensor& offsets, int64_t num_indices) {
  const int64_t* o = offsets.data_ptr<int64_t>();
  const int64_t nb = offsets.numel() - 1;
  TORCH_CHECK_INDEX(o[0] >= 0 && o[nb] <= num_indices, "picasso native: offsets must lie in [0, ", num_indices,
                    "], got first ", o[0], " last ", o[nb]);
  for (int64_t b = 0; b < nb; ++b)
    TORCH_CHECK_VALUE(o[b] <= o[b + 1], "picasso native: offsets must be non-decreasing (bag ", b, ")");
}

void check_bag_args(const at::Tensor& indices, const at::Tensor& offsets, const std::optional<at::Tensor>& psw,
                    const at::Tensor& values) {
  require_ids(indices, "indices");
  require_ids(offsets, "offsets");
  require_cpu(psw, "per_sample_weights");
  TORCH_CHECK_VALUE(indices.dim() == 1, "picasso native: indices must be 1-D");
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.numel() >= 1,
                    "picasso native: offsets must be 1-D with num_bags + 1 entries");
  TORCH_CHECK_VALUE(values.dim() == 2, "picasso native: expected a 2-D float tensor");
  if (psw) {
    TORCH_CHECK_VALUE(psw->numel() == indices.numel(), "picasso native: per_sample_weights needs ",
                      indices.numel(), " entries, got ", psw->numel());
    TORCH_CHECK_TYPE(psw->scalar_type() == values.scalar_type(),
                     "picasso native: per_sample_weights dtype must match the embeddings");
  }
}

at::Tensor bag_forward(const at::Tensor& weight_in, const at::Tensor& indices_in, const at::Tensor& offsets_in,
                       const std::string& mode, const std::optional<at::Tensor>& psw_in) {
  require_cpu(weight_in, "weight");
  check_bag_args(indices_in, offsets_in, psw_in, weight_in);
  const Pool pool = pool_of(mode);
  TORCH_CHECK_VALUE(!(psw_in && pool != Pool::Sum),
                    "picasso native: per_sample_weights is only supported for mode='sum'");
  const at::Tensor weight = weight_in.contiguous();
  const at::Tensor indices = as_long(indices_in), offsets = as_long(offsets_in);
  std::optional<at::Tensor> psw;
  if (psw_in) psw = psw_in->contiguous();
  const int64_t num_bags = offsets.numel() - 1;
  at::Tensor out = at::empty({num_bags, weight.size(1)}, weight.options());
  {
    pybind11::gil_scoped_release nogil;
    cpu::bag_forward(dtype_of(weight), weight.data_ptr(), weight.size(0), weight.size(1),
                     indices.data_ptr<int64_t>(), indices.numel(), offsets.data_ptr<int64_t>(), num_bags, pool,
                     psw ? psw->data_ptr() : nullptr, out.data_ptr());
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> bag_backward(const at::Tensor& grad_in, const at::Tensor& indices_in,
                                                const at::Tensor& offsets_in, const std::string& mode,
                                                const std::optional<at::Tensor>& psw_in) {
  require_cpu(grad_in, "grad_out");
  check_bag_args(indices_in, offsets_in, psw_in, grad_in);
  TORCH_CHECK_VALUE(grad_in.size(0) == offsets_in.numel() - 1, "picasso native: grad_out has ", grad_in.size(0),
                    " rows for ", offsets_in.numel() - 1, " bags");
  const Pool pool = pool_of(mode);
  const at::Tensor grad = grad_in.contiguous();
  const at::Tensor indices = as_long(indices_in), offsets = as_long(offsets_in);
  std::optional<at::Tensor> psw;
  if (psw_in) psw = psw_in->contiguous();
  check_offsets_cpu(offsets, indices.numel());
  const int64_t num_bags = offsets.numel() - 1;
  const int64_t* o = offsets.data_ptr<int64_t>();
  const int64_t used = o[num_bags] - o[0];
  at::Tensor rows = at::empty({used}, indices.options());
  at::Tensor grads = at::empty({used, grad.size(1)}, grad.options());
  int64_t u = 0;
  {
    pybind11::gil_scoped_release nogil;
    u = cpu::bag_backward(dtype_of(grad), grad.data_ptr(), grad.size(1), indices.data_ptr<int64_t>(), o, num_bags,
                          pool, psw ? psw->data_ptr() : nullptr, rows.data_ptr<int64_t>(), grads.data_ptr());
  }
  return {rows.narrow(0, 0, u), grads.narrow(0, 0, u)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique(const at::Tensor& ids_in) {
  require_ids(ids_in, "ids");
  const at::Tensor ids = as_long(ids_in).reshape({-1});
  const int64_t n = ids.numel();
  at::Tensor uniq = at::empty({n}, ids.options());
  at::Tensor inverse = at::empty({n}, ids.options());
  at::Tensor counts = at::empty({n}, ids.options());
  int64_t u = 0;
  {
    pybind11::gil_scoped_release nogil;
    u = cpu::unique(ids.data_ptr<int64_t>(), n, uniq.data_ptr<int64_t>(), inverse.data_ptr<int64_t>(),
                    counts.data_ptr<int64_t>());
  }
  return {uniq.narrow(0, 0, u).to(ids_in.scalar_type()), inverse.view(ids_in.sizes()), counts.narrow(0, 0, u)};
}

// A hot map as the CPU kernels read it: 1-D, contiguous, int32 kept (else int64); none stays none.
std::pair<std::optional<at::Tensor>, bool> hot_map_arg(const std::optional<at::Tensor>& hot_map_in) {
  if (!hot_map_in) return {std::nullopt, false};
  TORCH_CHECK_VALUE(hot_map_in->dim() == 1, "picasso native: hot_map must be 1-D");
  const bool is_int32 = hot_map_in->scalar_type() == at::kInt;
  return {is_int32 ? hot_map_in->contiguous() : as_long(*hot_map_in), is_int32};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> route_ids(
    const at::Tensor& ids_in, const std::optional<at::Tensor>& hot_map_in, int64_t num_owners) {
  require_ids(ids_in, "ids");
  require_ids(hot_map_in, "hot_map");
  TORCH_CHECK_VALUE(ids_in.dim() == 1, "picasso native: ids must be 1-D");
  TORCH_CHECK_VALUE(num_owners >= 1, "picasso native: num_owners must be >= 1, got ", num_owners);
  const at::Tensor ids = as_long(ids_in);
  const auto [hot_map, is_int32] = hot_map_arg(hot_map_in);
  const int64_t n = ids.numel();
  const auto opts = ids.options();
  at::Tensor hot_pos = at::empty({n}, opts), hot_slot = at::empty({n}, opts);
  at::Tensor cold_pos = at::empty({n}, opts), cold_local = at::empty({n}, opts);
  at::Tensor counts = at::empty({num_owners}, opts);
  int64_t hot = 0;
  {
    pybind11::gil_scoped_release nogil;
    hot = cpu::route_ids(ids.data_ptr<int64_t>(), n, hot_map ? hot_map->data_ptr() : nullptr, is_int32,
                         hot_map ? hot_map->numel() : 0, num_owners, hot_pos.data_ptr<int64_t>(),
                         hot_slot.data_ptr<int64_t>(), cold_pos.data_ptr<int64_t>(), cold_local.data_ptr<int64_t>(),
                         counts.data_ptr<int64_t>());
  }
  const int64_t cold = n - hot;
  return {hot_pos.narrow(0, 0, hot), hot_slot.narrow(0, 0, hot), cold_pos.narrow(0, 0, cold),
          cold_local.narrow(0, 0, cold).to(ids_in.scalar_type()), counts};
}

at::Tensor bag_owner_counts(const at::Tensor& ids_in, const at::Tensor& offsets_in,
                            const std::optional<at::Tensor>& hot_map_in, int64_t num_owners) {
  require_ids(ids_in, "ids");
  require_ids(offsets_in, "offsets");
  require_ids(hot_map_in, "hot_map");
  TORCH_CHECK_VALUE(ids_in.dim() == 1 && offsets_in.dim() == 1 && offsets_in.numel() >= 1,
                    "picasso native: ids and offsets must be 1-D (offsets with at least one entry)");
  TORCH_CHECK_VALUE(num_owners >= 1, "picasso native: num_owners must be >= 1, got ", num_owners);
  const at::Tensor ids = as_long(ids_in), offsets = as_long(offsets_in);
  const auto [hot_map, is_int32] = hot_map_arg(hot_map_in);
  const int64_t num_bags = offsets.numel() - 1;
  at::Tensor counts = at::empty({num_owners + 1, num_bags}, ids.options());
  {
    pybind11::gil_scoped_release nogil;
    cpu::bag_owner_counts(ids.data_ptr<int64_t>(), ids.numel(), offsets.data_ptr<int64_t>(), num_bags,
                          hot_map ? hot_map->data_ptr() : nullptr, is_int32, hot_map ? hot_map->numel() : 0,
                          num_owners, counts.data_ptr<int64_t>());
  }
  return counts;
}

// Row-wise Adagrad's state: one value per weight row, contiguous, of the weight's dtype.
void check_state(const std::optional<at::Tensor>& state, const at::Tensor& weight, Optim opt) {
  if (opt != Optim::RowwiseAdagrad) return;
  TORCH_CHECK_VALUE(state.has_value(), "rowwise_adagrad needs a state tensor");
  TORCH_CHECK_VALUE(state->is_contiguous() && state->numel() == weight.size(0) &&
                        state->scalar_type() == weight.scalar_type(),
                    "picasso native: state must be a contiguous [", weight.size(0), "] tensor of the weight dtype");
}

void sparse_update(at::Tensor& weight, const std::optional<at::Tensor>& state, const at::Tensor& rows_in,
                   const at::Tensor& grads_in, const std::string& optimizer, double lr, double eps) {
  const Optim opt = optim_of(optimizer);
  require_cpu(weight, "weight");
  require_cpu(state, "state");
  require_ids(rows_in, "rows");
  require_cpu(grads_in, "grads");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.is_contiguous(),
                    "picasso native: sparse_update needs a contiguous 2-D weight");
  TORCH_CHECK_VALUE(rows_in.dim() == 1, "picasso native: rows must be 1-D");
  TORCH_CHECK_VALUE(grads_in.dim() == 2 && grads_in.size(0) == rows_in.numel() && grads_in.size(1) == weight.size(1),
                    "picasso native: grads must be [", rows_in.numel(), ", ", weight.size(1), "]");
  TORCH_CHECK_TYPE(grads_in.scalar_type() == weight.scalar_type(), "picasso native: grads dtype must match weight");
  if (rows_in.numel() == 0) return;
  check_state(state, weight, opt);
  const at::Tensor rows = as_long(rows_in), grads = grads_in.contiguous();
  void* state_ptr = opt == Optim::RowwiseAdagrad ? state->data_ptr() : nullptr;
  pybind11::gil_scoped_release nogil;
  cpu::sparse_update(dtype_of(weight), weight.data_ptr(), weight.size(0), weight.size(1), state_ptr,
                     rows.data_ptr<int64_t>(), rows.numel(), grads.data_ptr(), opt, lr, eps);
}

// sparse_update with row i's gradient at grads[grad_index[i]]: CPU tensors only (the Python
// wrapper expands the gradients for anything else).
void sparse_update_indexed(at::Tensor& weight, const std::optional<at::Tensor>& state, const at::Tensor& rows_in,
                           const at::Tensor& grads_in, const at::Tensor& index_in, const std::string& optimizer,
                           double lr, double eps) {
  const Optim opt = optim_of(optimizer);
  require_cpu(weight, "weight");
  require_cpu(state, "state");
  require_ids(rows_in, "rows");
  require_cpu(grads_in, "grads");
  require_ids(index_in, "grad_index");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.is_contiguous(),
                    "picasso native: sparse_update_indexed needs a contiguous 2-D weight");
  TORCH_CHECK_VALUE(rows_in.dim() == 1 && index_in.dim() == 1 && index_in.numel() == rows_in.numel(),
                    "picasso native: rows and grad_index must be 1-D of one length");
  TORCH_CHECK_VALUE(grads_in.dim() == 2 && grads_in.size(1) == weight.size(1),
                    "picasso native: grads must be [*, ", weight.size(1), "]");
  TORCH_CHECK_TYPE(grads_in.scalar_type() == weight.scalar_type(), "picasso native: grads dtype must match weight");
  if (rows_in.numel() == 0) return;
  check_state(state, weight, opt);
  const at::Tensor rows = as_long(rows_in), index = as_long(index_in), grads = grads_in.contiguous();
  void* state_ptr = opt == Optim::RowwiseAdagrad ? state->data_ptr() : nullptr;
  pybind11::gil_scoped_release nogil;
  cpu::sparse_update_indexed(dtype_of(weight), weight.data_ptr(), weight.size(0), weight.size(1), state_ptr,
                             rows.data_ptr<int64_t>(), rows.numel(), grads.data_ptr(), grads.size(0),
                             index.data_ptr<int64_t>(), opt, lr, eps);
}

// The f inputs of the dot interaction: CPU, fp32, contiguous, [n, d] each.
std::vector<const float*> interaction_inputs(const std::vector<at::Tensor>& xs) {
  TORCH_CHECK_VALUE(!xs.empty(), "picasso native: dot interaction needs at least one input");
  const auto n = xs[0].size(0), d = xs[0].size(1);
  std::vector<const float*> rows;
  for (const auto& x : xs) {
    TORCH_CHECK_VALUE(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous() &&
                          x.size(0) == n && x.size(1) == d,
                      "picasso native: dot interaction inputs must be contiguous CPU fp32 [", n, ", ", d, "]");
    rows.push_back(x.data_ptr<float>());
  }
  return rows;
}

at::Tensor dot_interaction_forward(const std::vector<at::Tensor>& xs) {
  const auto rows = interaction_inputs(xs);
  const int64_t f = xs.size(), n = xs[0].size(0), d = xs[0].size(1);
  at::Tensor out = at::empty({n, d + f * (f - 1) / 2}, xs[0].options());
  pybind11::gil_scoped_release nogil;
  cpu::dot_interaction_forward(rows.data(), f, d, n, out.data_ptr<float>());
  return out;
}

// Gradients of the first input [n, d] and of the others, stacked [f - 1, n, d].
std::tuple<at::Tensor, at::Tensor> dot_interaction_backward(const at::Tensor& grad_in,
                                                            const std::vector<at::Tensor>& xs) {
  const auto rows = interaction_inputs(xs);
  const int64_t f = xs.size(), n = xs[0].size(0), d = xs[0].size(1);
  require_cpu(grad_in, "grad");
  const at::Tensor grad = grad_in.contiguous();
  TORCH_CHECK_VALUE(grad.scalar_type() == at::kFloat && grad.dim() == 2 && grad.size(0) == n &&
                        grad.size(1) == d + f * (f - 1) / 2,
                    "picasso native: dot interaction gradient must be fp32 [", n, ", ", d + f * (f - 1) / 2, "]");
  at::Tensor first = at::empty({n, d}, grad.options()), rest = at::empty({f - 1, n, d}, grad.options());
  std::vector<float*> outs{first.data_ptr<float>()};
  for (int64_t i = 1; i < f; ++i) outs.push_back(rest.data_ptr<float>() + (i - 1) * n * d);
  pybind11::gil_scoped_release nogil;
  cpu::dot_interaction_backward(grad.data_ptr<float>(), rows.data(), f, d, n, outs.data());
  return {first, rest};
}

// `fn` with every C++ error turned into pybind11's Python exception of the same kind, raised by
// this module's own dispatcher.
template <class R, class... A>
auto guarded(R (*fn)(A...)) {
  return [fn](A... args) -> R {
    try {
      return fn(std::forward<A>(args)...);
    } catch (const c10::IndexError& e) {
      throw pybind11::index_error(e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      throw pybind11::type_error(e.what_without_backtrace());
    } catch (const c10::Error& e) {  // ValueError and any other check
      throw pybind11::value_error(e.what_without_backtrace());
    } catch (const std::out_of_range& e) {
      throw pybind11::index_error(e.what());
    } catch (const std::invalid_argument& e) {
      throw pybind11::value_error(e.what());
    }
  };
}

}  // namespace
}  // namespace picasso

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "picasso native kernels of the embedding hot path";
  m.def("bag_forward", picasso::guarded(&picasso::bag_forward), "packed gather + pool", pybind11::arg("weight"),
        pybind11::arg("indices"), pybind11::arg("offsets"), pybind11::arg("mode") = "sum",
        pybind11::arg("per_sample_weights") = pybind11::none());
  m.def("bag_backward", picasso::guarded(&picasso::bag_backward), "sparse gradient of bag_forward", pybind11::arg("grad_out"),
        pybind11::arg("indices"), pybind11::arg("offsets"), pybind11::arg("mode") = "sum",
        pybind11::arg("per_sample_weights") = pybind11::none());
  m.def("unique", picasso::guarded(&picasso::unique), "sorted unique with inverse and counts", pybind11::arg("ids"));
  m.def("route_ids", picasso::guarded(&picasso::route_ids), "hot/cold split and owner grouping", pybind11::arg("ids"),
        pybind11::arg("hot_map"), pybind11::arg("num_owners"));
  m.def("bag_owner_counts", picasso::guarded(&picasso::bag_owner_counts), "per bag: cold IDs per owner, then hot IDs",
        pybind11::arg("ids"), pybind11::arg("offsets"), pybind11::arg("hot_map"), pybind11::arg("num_owners"));
  m.def("sparse_update", picasso::guarded(&picasso::sparse_update), "in-place sparse SGD / row-wise Adagrad", pybind11::arg("weight"),
        pybind11::arg("state"), pybind11::arg("rows"), pybind11::arg("grads"), pybind11::arg("optimizer"),
        pybind11::arg("lr"), pybind11::arg("eps") = 1e-8);
  m.def("sparse_update_indexed", picasso::guarded(&picasso::sparse_update_indexed),
        "sparse_update with shared gradient rows (row i's gradient is grads[grad_index[i]])", pybind11::arg("weight"),
        pybind11::arg("state"), pybind11::arg("rows"), pybind11::arg("grads"), pybind11::arg("grad_index"),
        pybind11::arg("optimizer"), pybind11::arg("lr"), pybind11::arg("eps") = 1e-8);
  m.def("dot_interaction_forward", picasso::guarded(&picasso::dot_interaction_forward), "DLRM dot interaction [first | pairs]",
        pybind11::arg("inputs"));
  m.def("dot_interaction_backward", picasso::guarded(&picasso::dot_interaction_backward), "gradients of the dot interaction",
        pybind11::arg("grad"), pybind11::arg("inputs"));
}
