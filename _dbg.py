import numpy as np, sys
sys.path.insert(0, "tests")
from test_executor_equivalence import dist_cases
from executor.spawn import run_ranks
from executor.verify import synthetic_global_batches, local_rows
from executor.comm import Comm
from executor.trainer import Trainer
from executor.reference import Reference
from planner.plan import Plan

def w(rank, world, case):
    plan = Plan.from_dict(case[0]); bs = synthetic_global_batches(plan, case[3], case[2])
    tr = Trainer(plan, case[1], Comm())
    for b in bs: tr.step(local_rows(b, plan, rank))
    if rank: return None
    ref = Reference(plan)
    for b in bs: ref.step(b)
    out = []
    for (n, a), (_, b) in zip(tr.dense.state_dict().items(), ref.dense.state_dict().items()):
        d = (a-b).abs(); i = d.argmax()
        out.append((n, float(d.max()/b.abs().max()), float(a.flatten()[i]), float(b.flatten()[i])))
    return out
if __name__ == "__main__":
    cases = dist_cases(4, 6, 4)
    for c in cases:
        if c[0]["optimizer"]["dense"] == "adagrad":
            for r in run_ranks(w, 4, c)[0]: print(r)
            print("--", c[0]["packs"][0]["sharding"], c[0]["micro_batches"])
