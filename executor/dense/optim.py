"""Dense optimizers (SGD, Adagrad, Adam) with torch.optim's update rules.

Written out here because torch.optim imports torch._dynamo on first use (seconds per
worker process); the trainer and the reference both use these, so they agree exactly.
With `logical_shapes` (executor.dense.padding: weights widened for tensor cores) the state
dict holds each state tensor at its parameter's logical shape and loading pads it again, so
checkpoints do not depend on the widening.
"""

from __future__ import annotations

import math

import torch

from executor.dense.padding import narrow_to, pad_to


class DenseOptimizer:
    def __init__(self, params, kind: str, lr: float, eps: float = 1e-8, betas: tuple[float, float] = (0.9, 0.999),
                 logical_shapes: list[tuple[int, ...]] | None = None) -> None:
        if kind not in ("sgd", "adagrad", "adam"):
            raise ValueError(f"unknown dense optimizer {kind!r}")
        self.params = list(params)
        self.shapes = logical_shapes or [tuple(p.shape) for p in self.params]
        if len(self.shapes) != len(self.params):
            raise ValueError(f"{len(self.shapes)} logical shapes for {len(self.params)} dense parameters")
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
        return {"kind": self.kind, "steps": self.steps,  # narrow_to copies a widened tensor, clone the rest
                "state": [{k: narrow_to(v, shape) if tuple(v.shape) != shape else v.clone() for k, v in s.items()}
                          for s, shape in zip(self.state, self.shapes)]}

    def load_state_dict(self, d: dict) -> None:
        if d.get("kind") != self.kind or len(d.get("state", [])) != len(self.params):
            raise ValueError(f"dense optimizer state is for {d.get('kind')!r} over {len(d.get('state', []))} tensors, "
                             f"this run uses {self.kind!r} over {len(self.params)}")
        self.steps = int(d["steps"])
        self.state = [{k: pad_to(v.to(p.device), tuple(p.shape)).clone() for k, v in s.items()}
                      for s, p in zip(d["state"], self.params)]
