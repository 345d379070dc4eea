#!/usr/bin/env python3
"""Reference for DiLoCo's outer optimizer (src/lowcomm/lowcomm.h outer_sgd): torch.optim.SGD with
the pseudo-gradients as gradients. Reads from stdin: lr momentum nesterov(0/1) n steps, then the
start parameters (n floats) and steps x n pseudo-gradients; prints the parameters after each step.
usage: torch_outer_sgd_ref.py < input"""
import sys

import torch

vals = sys.stdin.read().split()
lr, mu, nest, n, steps = float(vals[0]), float(vals[1]), vals[2] == "1", int(vals[3]), int(vals[4])
x = torch.tensor([float(v) for v in vals[5:5 + n]], dtype=torch.float32, requires_grad=True)
opt = torch.optim.SGD([x], lr=lr, momentum=mu, nesterov=nest)
at = 5 + n
for s in range(steps):
    x.grad = torch.tensor([float(v) for v in vals[at:at + n]], dtype=torch.float32)
    at += n
    opt.step()
    print(" ".join(repr(float(v)) for v in x.detach()))
