"""The executor's step on one device against its prediction and against the pure-PyTorch path.

For each batch size: the planner's plan for one device (`picasso plan`, from a profile of
synthetic Criteo rows) trained by `picasso run --preload` (whole steps timed, no per-op
timing), its samples/s beside the planner's predicted samples/s; at the largest batch also
with the torch kernels in place of the Triton ones (PICASSO_TRITON=0); then the same model
as plain PyTorch (one nn.EmbeddingBag per table, dense gradients, torch.optim.Adagrad for
every parameter), timed the same way, in the same command. dlrm-criteo-kaggle runs with
tf32 dense, dlrm-mlperf with bf16 dense (rows capped at --mlperf-row-cap).

    python bench/bench_executor_gpu.py                      # on the GPU (bench/gpu_session.sh executor)
    python bench/bench_executor_gpu.py --quick              # CPU smoke run: small tables and batches
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from results_path import results_path  # noqa: E402
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def picasso(*args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-m", "picasso", *args], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, **(env or {})})
    if out.returncode:
        raise SystemExit(f"picasso {' '.join(args[:2])} failed: {out.stderr.strip()[-400:]}")
    return out.stdout


OTHER_MODELS = ("dcn-v2", "deepfm", "wide-deep")
VARIANTS = {  # how a variant runs the same plan: picasso run flags, environment
    "triton": (["--cuda-graph", "off"], None),  # eager
    "graph": (["--cuda-graph", "on"], None),  # the steady step replayed as one CUDA graph (the default on one GPU)
    "torch": (["--cuda-graph", "off"], {"PICASSO_TRITON": "0"}),  # eager, the torch kernels in place of Triton's
    "compiled": (["--cuda-graph", "on"], {"PICASSO_DENSE_COMPILE": "inductor"}),  # the dense half by torch.compile
}


def prepare_data(d: Path, rows: int) -> None:
    """Synthetic Criteo rows in `d` (data.tsv, its profile, the converted dataset), unless there
    already with at least `rows` rows."""
    d.mkdir(parents=True, exist_ok=True)
    mark = d / "rows.txt"
    if mark.exists() and int(mark.read_text()) >= rows and (d / "dataset").exists():
        return
    picasso("synth", "--preset", "criteo-kaggle", "--rows", str(rows), "-o", str(d / "data.tsv"), "--seed", "0")
    picasso("analyze", str(d / "data.tsv"), "--format", "criteo", "-o", str(d / "profile.json"))
    picasso("convert", str(d / "data.tsv"), "--format", "criteo", "-o", str(d / "dataset"), "--force")
    mark.write_text(str(rows))


def make_plan(d: Path, model: str, hardware: str, batch: int, row_cap: int | None, dense_dtype: str) -> Path:
    plan = d / f"{model}-{batch}-{row_cap or 'full'}.json"
    if not plan.exists():
        picasso("plan", "--model", model, "--hardware", hardware, "--set", "gpus_per_node=1", "--profile",
                str(d / "profile.json"), "--batch-size", str(batch), "-o", str(plan), "--dense-dtype", dense_dtype,
                *(["--row-cap", str(row_cap)] if row_cap else []))
    return plan


def run_plan(d: Path, plan: Path, steps: int, variant: str) -> dict:
    flags, env = VARIANTS[variant]
    t = time.perf_counter()
    out = picasso("run", str(plan), "--data", str(d / "dataset"), "--nproc", "1", "--steps", str(steps), "--preload",
                  "--json", *flags, env=env)
    res = json.loads(out)
    return {k: res.get(k) for k in ("samples_per_s", "predicted_samples_per_s", "measured_over_predicted_samples",
                                    "iteration_ms", "dense_dtype", "device")} | {
        "kernels": variant, "wall_s": round(time.perf_counter() - t, 1)}


class PlainDLRM(nn.Module):
    """The pure-PyTorch path: nn.EmbeddingBag per table, the executor's dense DLRM."""

    def __init__(self, model) -> None:
        super().__init__()
        from executor.dense.model import build_dense

        self.spec = model
        self.bags = nn.ModuleList(nn.EmbeddingBag(t.num_rows, t.dim, mode="sum", include_last_offset=True)
                                  for t in model.tables)
        self.dense = build_dense(model, 0)

    def forward(self, batch) -> torch.Tensor:
        embs = {t.name: bag(*batch.sparse[t.name]) for t, bag in zip(self.spec.tables, self.bags)}
        return self.dense(batch.dense, embs, {})


def plain_fits(model, device: torch.device) -> str | None:
    """Why the plain PyTorch step cannot hold the model on `device`, or None: its tables, their
    dense gradients and Adagrad's state are three full copies (dlrm-mlperf's 96 GB tables are not)."""
    if device.type != "cuda":
        return None
    need = 3 * sum(t.num_rows * t.dim * 4 for t in model.tables)
    free = torch.cuda.mem_get_info(device)[0]
    return None if need <= 0.9 * free else f"needs {need / 2**30:.0f} GiB (tables, dense gradients, Adagrad state), {free / 2**30:.0f} GiB free"


def time_plain(plan_d: dict, data: Path, steps: int, device: torch.device, bf16: bool,
               tf32: bool) -> tuple[float | None, str | None]:
    """(samples/s, None) of the plain PyTorch step on the plan's model and batch (events on CUDA),
    with the same dense precision (TF32 matmuls, or bf16 autocast); (None, why) where it does not
    fit (an out-of-memory included: the rows after it still run, in their own processes)."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    from planner.plan import Plan

    plan = Plan.from_dict(plan_d)
    model, b = plan.model, plan.batch_size_per_rank
    if why := plain_fits(model, device):
        return None, why
    try:
        return _time_plain(model, b, data, steps, device, bf16), None
    except torch.OutOfMemoryError as e:
        return None, f"out of memory: {str(e)[:120]}"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _time_plain(model, b: int, data: Path, steps: int, device: torch.device, bf16: bool) -> float:
    from executor.data.batches import RawBatch, feature_map, reader_chunks, to_batch

    raw = next(iter(reader_chunks(str(data), "criteo")))
    while len(raw) < b:
        raw = RawBatch.concat([raw, raw])
    batch = to_batch(raw.slice(0, b), model, feature_map(model, raw.sparse)).to(device)
    net = PlainDLRM(model).to(device)
    opt = torch.optim.Adagrad(net.parameters(), lr=0.01)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logit = net(batch)
        loss = F.binary_cross_entropy_with_logits(logit.float(), batch.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(steps):
            step()
        e.record()
        torch.cuda.synchronize()
        secs = a.elapsed_time(e) * 1e-3
    else:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        secs = time.perf_counter() - t
    return b * steps / secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: row cap 20k, batches 256/512")
    ap.add_argument("--batches", default=None, help="per-device batch sizes (default 4096,16384,65536)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mlperf-row-cap", type=int, default=0,
                    help="rows per dlrm-mlperf table (0: full size; a failed full run falls back to 1M)")
    ap.add_argument("--variants", default="triton,graph", help="variants at every batch (triton, graph, torch)")
    ap.add_argument("--extra-variant", default="", help="variants run at the largest batch of --extra-models only "
                    "(e.g. compiled: wall_s includes the compile)")
    ap.add_argument("--extra-models", default="dlrm-criteo-kaggle")
    ap.add_argument("--models", default="dlrm-criteo-kaggle,dlrm-mlperf",
                    help=f"which models to run: dlrm-criteo-kaggle, dlrm-mlperf, {', '.join(OTHER_MODELS)}")
    ap.add_argument("--other-batch", type=int, default=16384, help=f"batch of {', '.join(OTHER_MODELS)}")
    ap.add_argument("--work", type=Path, help="keep data and plans in this folder (reused by a later run, e.g. "
                    "bench_step_floor.py --work)")
    ap.add_argument("-o", "--output", help="default bench/results/executor_gpu/<gpu>.json")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    gpu = torch.cuda.get_device_name(0) if cuda else "cpu"
    hardware = ("h200" if "H200" in gpu else "dgx-h100") if cuda else "local-cpu"
    output = Path(args.output or results_path("executor_gpu"))
    batches = [int(x) for x in (args.batches or ("256,512" if args.quick else "4096,16384,65536")).split(",")]
    steps = 4 if args.quick else args.steps
    variants = [v for v in args.variants.split(",") if v and (cuda or v == "triton")]
    cases = [("dlrm-criteo-kaggle", "tf32", batches, 20_000 if args.quick else None)]
    if not args.quick:
        cases.append(("dlrm-mlperf", "bf16", [batches[-1]], args.mlperf_row_cap or None))
        # the other architectures at one batch (the middle one of the default sizes)
        cases += [(m, "tf32", [args.other_batch], None) for m in OTHER_MODELS]
    cases = [c for c in cases if c[0] in args.models.split(",")]
    machine = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__, "device": gpu}
    out = {"machine": machine, "command": " ".join(["python", *sys.argv]), "quick": args.quick, "rows": []}

    def save() -> None:  # after every row: a cut-short run keeps what it measured
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(out, indent=2) + "\n")

    def record(r: dict, model: str, b: int, ddt: str, cap, plain, why_no_plain) -> None:
        r.update(model=model, batch=b, row_cap=cap, plain_samples_per_s=plain,
                 over_plain=(r["samples_per_s"] or 0) / plain if plain else None)
        if why_no_plain:
            r["plain_not_run"] = why_no_plain
        out["rows"].append(r)
        save()
        print(f"{model:20s} batch {b:6d} {ddt:5s} {r['kernels']:8s} picasso {r['samples_per_s']:12,.0f}/s "
              f"predicted {r['predicted_samples_per_s'] or 0:12,.0f}/s "
              f"ratio {r['measured_over_predicted_samples'] or 0:5.2f}  plain {plain or 0:12,.0f}/s "
              f"x{r['over_plain'] or 0:5.2f}  ({r['wall_s']} s)", flush=True)

    extras = []  # (variant, plan, model, batch, ...): run after every case, so a slow one (a compile) cuts nothing
    with tempfile.TemporaryDirectory() as tmp:
        d = args.work or Path(tmp)
        prepare_data(d, max(max(bs) for _, _, bs, _ in cases) * (steps + 4))
        for model, ddt, bs, cap in cases:
            for b in bs:
                try:
                    try:
                        plan = make_plan(d, model, hardware, b, cap, ddt)
                        first = run_plan(d, plan, steps, variants[0])
                    except SystemExit as e:
                        if cap is not None:
                            raise
                        out.setdefault("full_rows_failed", {})[model] = str(e)
                        print(f"{model} at full size failed ({e}); rows capped at 1M", flush=True)
                        cap = 1_000_000
                        plan = make_plan(d, model, hardware, b, cap, ddt)
                        first = run_plan(d, plan, steps, variants[0])
                except SystemExit as e:  # this case fails alone: the others still run
                    out.setdefault("failed", []).append({"model": model, "batch": b, "error": str(e)[-400:]})
                    save()
                    print(f"{model} batch {b} failed: {e}", flush=True)
                    continue
                plain, why_no_plain = time_plain(json.loads(plan.read_text()), d / "data.tsv", steps, device,
                                                 ddt == "bf16", ddt == "tf32")
                # the torch kernels' A/B against the eager Triton run, at the largest batch
                ab = cuda and b == bs[-1] and "triton" in variants and "torch" not in variants
                record(first, model, b, ddt, cap, plain, why_no_plain)
                for v in variants[1:] + (["torch"] if ab else []):
                    record(run_plan(d, plan, steps, v), model, b, ddt, cap, plain, why_no_plain)
                if b == bs[-1] and model in args.extra_models.split(","):
                    extras += [(v, plan, model, b, ddt, cap, plain, why_no_plain) for v in args.extra_variant.split(",")
                               if v and v not in variants and v in VARIANTS]
        for v, plan, *rest in extras:
            try:
                record(run_plan(d, plan, steps, v), *rest)
            except SystemExit as e:
                out.setdefault("failed", []).append({"model": rest[0], "batch": rest[1], "variant": v,
                                                     "error": str(e)[-400:]})
    save()
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
