"""Dense optimizers (SGD, Adagrad, Adam) with torch.optim's update rules.

Written out here because torch.optim imports torch._dynamo on first use (seconds per
worker process); the trainer and the reference both use these, so they agree exactly.
"""

from __future__ import annotations

import math

import torch


class DenseOptimizer:
    def __init__(self, params, kind: str, lr: float, eps: float = 1e-8, betas: tuple[float, float] = (0.9, 0.999)) -> None:
        if kind not in ("sgd", "adagrad", "adam"):
            raise ValueError(f"unknown dense optimizer {kind!r}")
        self.params = list(params)
        self.kind, self.lr, self.eps, self.betas = kind, lr, eps, betas
        self.steps = 0
        self.state: list[dict[str, torch.Tensor]] = [{} for _ in self.params]

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        b1, b2 = self.betas
        for p, st in zip(self.params, self.state):
            g = p.grad
            if g is None:
                continue
            if self.kind == "sgd":
                p.add_(g, alpha=-self.lr)
            elif self.kind == "adagrad":
                s = st.setdefault("sum", torch.zeros_like(p))
                s.addcmul_(g, g, value=1.0)
                p.addcdiv_(g, s.sqrt().add_(self.eps), value=-self.lr)
            else:
                m = st.setdefault("exp_avg", torch.zeros_like(p))
                v = st.setdefault("exp_avg_sq", torch.zeros_like(p))
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1 = 1 - b1**self.steps
                bc2 = 1 - b2**self.steps
                denom = (v.sqrt() / math.sqrt(bc2)).add_(self.eps)
                p.addcdiv_(m, denom, value=-self.lr / bc1)

    def state_dict(self) -> dict:
        return {"kind": self.kind, "steps": self.steps, "state": [{k: v.clone() for k, v in s.items()} for s in self.state]}

    def load_state_dict(self, d: dict) -> None:
        if d.get("kind") != self.kind or len(d.get("state", [])) != len(self.params):
            raise ValueError(f"dense optimizer state is for {d.get('kind')!r} over {len(d.get('state', []))} tensors, "
                             f"this run uses {self.kind!r} over {len(self.params)}")
        self.steps = int(d["steps"])
        self.state = [{k: v.to(p.device).clone() for k, v in s.items()} for s, p in zip(d["state"], self.params)]
