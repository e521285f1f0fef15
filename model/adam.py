"""Adam, as the paper trains with it: β1 0.9, β2 0.98, ε 1e-9, the learning rate set by the caller each step.

torch.optim.Adam computes the same, but every torch.optim.Optimizer imports torch._dynamo the first time
one of its methods runs (they are wrapped to keep torch.compile out): 2.7 s of CPU at the start of every
training process, each rank under torchrun included, for a compiler that training never uses. This class
does torch.optim.Adam's arithmetic (its single-tensor path, the one it takes for CPU tensors, no weight
decay) in the same order, so its steps are bit-identical, and its state_dict has torch.optim.Adam's layout,
so a checkpoint's moments load into either (tests/test_adam.py holds both).
"""

from __future__ import annotations

from typing import Iterable

import torch

# torch.optim.Adam's param_group keys with the values this class computes with; a state_dict saved by
# torch.optim.Adam with other values (weight decay, amsgrad, ...) is refused rather than half-followed.
_FIXED = {
    "weight_decay": 0,
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": None,
    "decoupled_weight_decay": False,
}


class Adam:
    """Adam over one group of parameters.

    Args:
        params: the parameters to update (each with its .grad set by backward()).
        lr: the learning rate until the caller sets param_groups[0]["lr"].
        betas: (β1, β2), the decay rates of the first and second moments.
        eps: ε, added to the second moment's square root.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
    ):
        self.params = list(params)
        self.param_groups = [{"lr": lr, "betas": tuple(betas), "eps": eps, **_FIXED}]
        self.state: dict[int, dict[str, torch.Tensor]] = {}  # parameter index -> step, exp_avg, exp_avg_sq

    def zero_grad(self) -> None:
        """Drops every parameter's gradient (backward() then makes a fresh one)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        group = self.param_groups[0]
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        for i, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            state = self.state.get(i)
            if state is None:
                state = self.state[i] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }
            state["step"] += 1
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = state["step"].item()
            bias_correction1 = 1 - beta1**step
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            param.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))

    def state_dict(self) -> dict:
        """torch.optim.Adam's layout: {"state": {index: {...}}, "param_groups": [{..., "params": [0..n)}]}."""
        group = {**self.param_groups[0], "params": list(range(len(self.params)))}
        return {"state": {i: dict(s) for i, s in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores the moments and the group's values from a state_dict of this class or torch.optim.Adam.

        Raises:
            ValueError: a state_dict for other parameters, or one that computed with settings this class
                does not (weight decay, amsgrad, ...).
        """
        groups = state_dict["param_groups"]
        if len(groups) != 1 or list(groups[0]["params"]) != list(range(len(self.params))):
            raise ValueError(
                f"the optimizer state holds {sum(len(g['params']) for g in groups)} parameters in "
                f"{len(groups)} group(s); this model has {len(self.params)} in one: it was saved for "
                "another model"
            )
        other = {k: groups[0][k] for k in _FIXED if k in groups[0] and groups[0][k] != _FIXED[k]}
        if other:
            raise ValueError(
                f"the optimizer state was saved with {other}; this trainer's Adam computes with {_FIXED}"
            )
        self.param_groups[0].update(lr=groups[0]["lr"], betas=tuple(groups[0]["betas"]), eps=groups[0]["eps"])
        self.state = {}
        for index, saved in state_dict["state"].items():
            param = self.params[int(index)]
            self.state[int(index)] = {
                "step": torch.as_tensor(saved["step"], dtype=torch.float32).clone(),
                "exp_avg": saved["exp_avg"].to(param.device, param.dtype),
                "exp_avg_sq": saved["exp_avg_sq"].to(param.device, param.dtype),
            }
