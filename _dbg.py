import sys; sys.path.insert(0,"tests")
import numpy as np, torch
import test_executor_equivalence as T
from executor.plans import random_plan
from executor.verify import synthetic_global_batches
from executor.comm import Comm
from executor.trainer import Trainer
from executor.reference import Reference
model = T.other_models()[1]
rng = np.random.default_rng(1)
for i in range(3):
    plan, hot = random_plan(model, 1, 16, rng, micro_batches=[1, 2, 4][i], optimizer=T.OPTS[i])
    bs = synthetic_global_batches(plan, 3, seed=i)
    tr = Trainer(plan, hot, Comm()); ref = Reference(plan)
    for s, b in enumerate(bs):
        tr.step(b); ref.step(b)
        for (n, a), (_, c) in zip(tr.dense.state_dict().items(), ref.dense.state_dict().items()):
            d = (a-c).abs(); 
            if d.max()/c.abs().max() > 1e-6:
                j = d.argmax()
                print(i, s, n, float(d.max()/c.abs().max()), float(a.flatten()[j]), float(c.flatten()[j]), c.abs().max().item())
