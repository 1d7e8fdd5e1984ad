"""`python -m executor.process.rank_call FOLDER`: one rank of executor.process.spawn.run_ranks.

It reads the call (function, arguments, timeout, threads) that run_ranks saved in FOLDER,
joins the process group through the store run_ranks hosts (executor.process.rendezvous), runs
fn(rank, world, *args) and leaves its result in FOLDER/rank<r>.pt, or its error in
FOLDER/rank<r>.err. A function of the caller's __main__ script is found by running that
script again under another name, as multiprocessing's spawn does.
"""

from __future__ import annotations

import datetime
import os
import runpy
import sys
import traceback
from pathlib import Path


def _function(ref: tuple[str, str, str | None]):
    module, name, script = ref
    if module == "__main__" and script:
        return runpy.run_path(script, run_name="__picasso_rank__")[name]
    import importlib

    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def main(folder: str) -> int:
    d = Path(folder)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        import torch
        import torch.distributed as dist

        from executor.process.rendezvous import join_store
        from executor.process.threads import set_rank_threads

        ref, args, timeout_s, threads = torch.load(d / "call.pt", weights_only=False)  # written by our caller
        set_rank_threads(world, threads)
        store = join_store(timeout_s)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        out = _function(ref)(rank, world, *args)
        tmp = d / f".rank{rank}.pt"
        torch.save(out, tmp)
        tmp.rename(d / f"rank{rank}.pt")
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported to run_ranks through the folder
        # written before the group goes down, so that it precedes its peers' broken collectives
        (d / f"rank{rank}.err").write_text(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
