"""The training engines a plan can be scored on, each as the named mechanisms (traits) it has.

picasso's own executor is what lowering mirrors by default. The systems users compare with
run a plan of their own (planner.builders) on an engine that differs from picasso's in a few
mechanisms; lowering applies each trait where it acts (which passes a kernel fuses, so their
round trips through device memory vanish; where a stage runs; how the optimizer reaches the
rows). A trait is a mechanism with its public source, never a factor: a system is slower or
faster than picasso's engine only through the bytes, FLOPs, kernels and ranks its traits change.

| trait | what lowering does | engines |
| --- | --- | --- |
| bottom_mlp_on_one_rank | the bottom MLP runs on rank 0 for the global batch (rank 0 holds no table on more than 4 ranks) | nvidia-dlrm |
| fused_interaction | the dot interaction is one kernel: it reads the F x D features once and writes the top MLP's input (backward: reads both, writes the features' gradient) | nvidia-dlrm, hugectr |
| fused_pool_interaction | the embedding output is consumed where it is produced: the pooled vectors' write and the interaction's read of them leave device memory (backward alike) | hugectr |
| sparse_grad_optimizer | on several GPUs, the backward writes one gradient row per lookup (a sparse tensor); the optimizer coalesces it (sort by row, sum runs) and applies it: no fusion of backward and update (on one GPU the fused gather's backward updates in place) | nvidia-dlrm |
| overlapped_pipeline | the step is not one serial chain: ops wait only for their inputs, so the gradient all-reduce and the exchanges run beside compute | hugectr |
| half_exchange | under a 16-bit dense dtype, embedding vectors, their gradients and the gradient all-reduce cross ranks in 16 bits | hugectr |
| fused_backward_optimizer | the backward sorts the lookups, sums each row's run and updates the row in the same kernel (FBGEMM TBE): no gradient rows in device memory | torchrec, hugectr, picasso |

Plans (which tables where, which exchange, hot rows) are the builders'; engines only cost them.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.modes import Mode


class Engine(Mode):
    """Whose executor runs the plan (Provenance.engine): lowering applies its traits."""

    PICASSO = "picasso"
    NVIDIA_DLRM = "nvidia-dlrm"
    HUGECTR = "hugectr"
    TORCHREC = "torchrec"


class Trait(Mode):
    """A mechanism of an engine that lowering applies (see the module's table)."""

    BOTTOM_MLP_ON_ONE_RANK = "bottom_mlp_on_one_rank"
    FUSED_INTERACTION = "fused_interaction"
    FUSED_POOL_INTERACTION = "fused_pool_interaction"
    SPARSE_GRAD_OPTIMIZER = "sparse_grad_optimizer"
    FUSED_BACKWARD_OPTIMIZER = "fused_backward_optimizer"
    OVERLAPPED_PIPELINE = "overlapped_pipeline"
    HALF_EXCHANGE = "half_exchange"


@dataclass(frozen=True)
class TraitInfo:
    trait: Trait
    mechanism: str  # what the engine does, in one line
    source: str  # where it is published


NV_DLE = "NVIDIA/DeepLearningExamples PyTorch/Recommendation/DLRM"
TRAITS: dict[Trait, TraitInfo] = {t.trait: t for t in (
    TraitInfo(Trait.BOTTOM_MLP_ON_ONE_RANK,
              "bottom MLP model-parallel on GPU 0 for the global batch; its output joins the embeddings' all-to-all",
              f"{NV_DLE}: dlrm/utils/distributed.py get_device_mapping, dlrm/model/distributed.py BottomToTop"),
    TraitInfo(Trait.FUSED_INTERACTION,
              "dot interaction as one kernel (tensor cores), features read once",
              f"{NV_DLE}: dlrm/cuda_src/dot_based_interact (--interaction_op cuda_dot, the default); HugeCTR "
              "DLRM's fused interaction layer (MLPerf Training v2.0/v2.1 NVIDIA submissions)"),
    TraitInfo(Trait.FUSED_POOL_INTERACTION,
              "embedding output consumed by the interaction without a round trip through device memory",
              "HugeCTR hybrid embedding (HugeCTR docs, 'Hybrid Embedding'; MLPerf Training v2.0/v2.1 NVIDIA "
              "HugeCTR DLRM: embedding, interaction and MLPs in fused kernels under one CUDA graph)"),
    TraitInfo(Trait.SPARSE_GRAD_OPTIMIZER,
              "backward writes one gradient row per lookup (sparse tensor); SGD coalesces and applies it",
              f"{NV_DLE}: dlrm/cuda_ext/sparse_embedding.py (gather_gpu_bwd returns a sparse gradient), "
              "torch.optim.SGD on sparse gradients; dlrm/scripts/main.py validate_flags: --embedding_type "
              "custom_cuda is joint_sparse on several GPUs, joint_fused (fused gather and SGD) on one"),
    TraitInfo(Trait.OVERLAPPED_PIPELINE,
              "embedding exchange, MLP weight gradients and the gradient all-reduce on their own streams, "
              "overlapping compute",
              "HugeCTR DLRM in MLPerf Training v2.0/v2.1 (NVIDIA): overlapped pipeline, asynchronous MLP weight "
              "gradients (HugeCTR docs: CreateSolver use_overlapped_pipeline, async_mlp_wgrad)"),
    TraitInfo(Trait.HALF_EXCHANGE,
              "with mixed precision, embedding vectors and all gradients communicated as fp16",
              "HugeCTR hybrid embedding: the communication type emtype is __half under mixed precision "
              "(frequent_embedding.hpp: 'buffer for communication can have fp16 type'); its dense all-reduce "
              "in fp16 (CreateSolver use_mixed_precision)"),
    TraitInfo(Trait.FUSED_BACKWARD_OPTIMIZER,
              "backward and sparse optimizer in one kernel per table batch: rows updated in place",
              "pytorch/FBGEMM fbgemm_gpu split_table_batched_embeddings_ops (TBE, optimizer fused in the "
              "backward); HugeCTR embedding update in its backward; picasso's Triton kernels"),
)}

ENGINE_TRAITS: dict[Engine, tuple[Trait, ...]] = {
    Engine.PICASSO: (Trait.FUSED_BACKWARD_OPTIMIZER,),
    Engine.NVIDIA_DLRM: (Trait.BOTTOM_MLP_ON_ONE_RANK, Trait.FUSED_INTERACTION, Trait.SPARSE_GRAD_OPTIMIZER),
    Engine.HUGECTR: (Trait.FUSED_INTERACTION, Trait.FUSED_POOL_INTERACTION, Trait.FUSED_BACKWARD_OPTIMIZER,
                     Trait.OVERLAPPED_PIPELINE, Trait.HALF_EXCHANGE),
    Engine.TORCHREC: (Trait.FUSED_BACKWARD_OPTIMIZER,),
}

def traits(engine: Engine | str | None) -> frozenset[Trait]:
    """The traits lowering applies for `engine` (None: picasso's own)."""
    return frozenset(ENGINE_TRAITS[Engine.from_str(engine or Engine.PICASSO, "engine")])


def describe(engine: Engine | str | None) -> list[str]:
    """One line per trait of `engine`: the mechanism and its source."""
    return [f"{TRAITS[t].trait}: {TRAITS[t].mechanism} ({TRAITS[t].source})"
            for t in ENGINE_TRAITS[Engine.from_str(engine or Engine.PICASSO, "engine")]]


