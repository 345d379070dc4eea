#!/usr/bin/env python3
"""PyTorch reference implementations of atoll's optimizers, written from the published
pseudo-code (see the header comment of each src/optim/*.h), for the numerics tests.

    torch_optim_ref.py IN.safetensors OUT.safetensors

IN holds, for parameter i, "p{i}.w0" (initial value) and "p{i}.g{t}" (gradient at step t), and a
"config" metadata entry (JSON): {"algo": ..., "steps": T, "lr_scale": s, "grad_scale": s, plus the
algorithm's hyperparameters}. OUT receives "p{i}.w" (the value after T steps). Everything is
computed in float64 so that the reference is the exact answer the float32 engine approximates.
safetensors is read and written with json + struct: no extra package needed.
"""
import json
import math
import os
import sys

import torch

DT = torch.float64


# ---------------------------------------------------------------- safetensors
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402


def load_st(path):
    return safetensors_lite.load(path)


def save_st(path, tensors):
    # The C++ side reads the results as f32.
    safetensors_lite.save(path, {k: t.detach().to(torch.float32) for k, t in tensors.items()})


# ---------------------------------------------------------------- shared pieces
QUINTIC = (3.4445, -4.7750, 2.0315)
POLAR_EXPRESS = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]


def ns_coeffs(schedule, steps):
    if schedule == "quintic":
        return [QUINTIC] * steps
    pe = [(a / 1.01, b / 1.01**3, c / 1.01**5) for (a, b, c) in POLAR_EXPRESS[:-1]] + [POLAR_EXPRESS[-1]]
    return [pe[min(i, 7)] for i in range(steps)]


def newton_schulz(G, cfg):
    schedule = cfg.get("ns_schedule", "quintic")
    X = G.clone()
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    safety = 1.01 if schedule == "polar_express" else 1.0
    X = X / (X.norm() * safety + 1e-7)
    for a, b, c in ns_coeffs(schedule, cfg.get("ns_steps", 5)):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if tall else X


def update_scale(mode, rows, cols, layout):
    fan_in, fan_out = (rows, cols) if layout == "in_out" else (cols, rows)
    if mode == "keller":
        return math.sqrt(max(1.0, fan_out / fan_in))
    if mode == "spectral":
        return math.sqrt(fan_out / fan_in)
    if mode == "rms":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


class Opt:
    def __init__(self, cfg, params):
        self.cfg, self.params, self.t = cfg, params, 0
        self.state = [dict() for _ in params]


# ---------------------------------------------------------------- Muon family
def muon_momentum(st, g, beta, nesterov):
    M = st.setdefault("m", torch.zeros_like(g))
    M.mul_(beta).add_(g, alpha=1 - beta)  # lerp(M, g, 1 - beta)
    return g * (1 - beta) + beta * M if nesterov else M.clone()


class Muon(Opt):
    def step(self, grads, lr):
        c = self.cfg
        self.t += 1
        for W, g, st in zip(self.params, grads, self.state):
            u = muon_momentum(st, g, c["momentum"], c["nesterov"])
            O = newton_schulz(u, c)
            s = update_scale(c["update_scale"], W.shape[0], W.shape[1], c["layout"])
            W.mul_(1 - lr * c["weight_decay"]).sub_(lr * s * O)


class PRMuon(Opt):
    # row_scale "frobenius": the row-normalized update has the orthogonal update's Frobenius norm;
    # "fit": it is scaled by c = <O, R> / <R, R>, fitted at the last refresh between the
    # orthogonal update O and the unit-slice normalization R of the same momentum.
    def step(self, grads, lr):
        c = self.cfg
        self.t += 1
        refresh = (self.t - 1) % c["period"] == 0
        fit = c.get("row_scale", "frobenius") == "fit"
        for W, g, st in zip(self.params, grads, self.state):
            u = muon_momentum(st, g, c["momentum"], c["nesterov"])
            m, n = W.shape
            # "neurons": the output neurons, rows of an out_in weight and columns of an in_out one
            by_rows = c["axis"] == "rows" or (c["axis"] == "neurons" and c["layout"] == "out_in")
            dim = 1 if by_rows else 0
            R = u / (u.norm(dim=dim, keepdim=True) + 1e-8)
            if refresh:
                O = newton_schulz(u, c)
                st["fit"] = float((O * R).sum() / (R * R).sum())
            elif fit:
                O = R * st.get("fit", 1.0)
            else:
                O = R * math.sqrt(min(m, n) / (m if dim == 1 else n))
            s = update_scale(c["update_scale"], m, n, c["layout"])
            W.mul_(1 - lr * c["weight_decay"]).sub_(lr * s * O)


class Dion3(Opt):
    def step(self, grads, lr):
        c = self.cfg
        self.t += 1
        for W, g, st in zip(self.params, grads, self.state):
            rows, cols = W.shape
            sel = c["select"]
            by_rows = sel == "rows" or (sel == "neurons" and c["layout"] == "out_in") or (sel == "shorter" and rows <= cols)
            M = st.setdefault("m", torch.zeros_like(W))
            M.add_(g)
            Ms = M if by_rows else M.T  # slices are rows of Ms (a view: writes reach M)
            V = st.setdefault("v", torch.zeros(Ms.shape[0], dtype=DT))
            k = max(1, math.ceil(c["fraction"] * Ms.shape[0]))
            norms = Ms.abs().sum(dim=1)
            # largest first, ties by index (as the engine)
            order = sorted(range(Ms.shape[0]), key=lambda i: (-norms[i].item(), i))
            idx = torch.tensor(sorted(order[:k]))
            U = Ms[idx].clone()
            Ms[idx] = Ms[idx] * c["mu"]
            O = newton_schulz(U, c)
            fro = O.norm()
            V[idx] = V[idx] + (1 - c["beta2"]) * ((O * O).mean(dim=1) - V[idx])
            O = O / (V[idx].sqrt() + 1e-8).unsqueeze(1)
            O = O * (fro / O.norm().clamp(min=1e-8))
            s = update_scale(c["update_scale"], rows, cols, c["layout"])
            W.mul_(1 - lr * c["weight_decay"])
            Ws = W if by_rows else W.T
            Ws[idx] = Ws[idx] - lr * s * O


# ---------------------------------------------------------------- SOAP
class Soap(Opt):
    def step(self, grads, lr):
        c = self.cfg
        self.t += 1
        t = self.t - 1
        sb = c["shampoo_beta"] if c["shampoo_beta"] >= 0 else c["beta2"]
        if c.get("correct_shampoo_bias", False):
            sb = 1 - (1 - sb) / (1 - sb**self.t)
        kl = c.get("factor_update", "ema") == "kl"

        def factor_increments(st, g, first):
            if not kl:
                return g @ g.T, g.T @ g
            # KL-Shampoo: G C_R G^T / n and G^T C_L G / m, C = Q diag(1 / max(l, eps)) Q^T (I at first)
            m, n = g.shape
            if first:
                CL, CR = torch.eye(m, dtype=DT), torch.eye(n, dtype=DT)
            else:
                CL = st["QL"] @ torch.diag(1 / st["lL"].clamp(min=c["eps"])) @ st["QL"].T
                CR = st["QR"] @ torch.diag(1 / st["lR"].clamp(min=c["eps"])) @ st["QR"].T
            return g @ CR @ g.T / n, g.T @ CL @ g / m

        for W, g, st in zip(self.params, grads, self.state):
            m, n = W.shape
            if t == 0:
                iL, iR = factor_increments(st, g, True)
                st["L"] = (1 - sb) * iL
                st["R"] = (1 - sb) * iR
                for side in ("L", "R"):
                    w, Q = torch.linalg.eigh(st[side])
                    st["Q" + side] = torch.flip(Q, [1])
                    st["l" + side] = torch.flip(w, [0])
                st["m"] = torch.zeros_like(W)
                st["v"] = torch.zeros_like(W)
                continue
            QL, QR = st["QL"], st["QR"]
            gp = QL.T @ g @ QR
            st["m"].mul_(c["beta1"]).add_(g, alpha=1 - c["beta1"])
            st["v"].mul_(c["beta2"]).add_(gp * gp, alpha=1 - c["beta2"])
            mp = QL.T @ st["m"] @ QR
            N = QL @ (mp / (st["v"].sqrt() + c["eps"])) @ QR.T
            step = lr * math.sqrt(1 - c["beta2"] ** t) / (1 - c["beta1"] ** t)
            if c.get("update_rms", 0.0) > 0:  # the update rescaled to a fixed RMS
                step = lr * c["update_rms"] / N.pow(2).mean().sqrt().item()
            W.sub_(step * N)
            W.mul_(1 - lr * c["weight_decay"])
            iL, iR = factor_increments(st, g, False)
            st["L"] = sb * st["L"] + (1 - sb) * iL
            st["R"] = sb * st["R"] + (1 - sb) * iR
            if t % c["precondition_frequency"] == 0:
                for side in ("L", "R"):
                    F, Q = st[side], st["Q" + side]
                    est = torch.diag(Q.T @ F @ Q)
                    order = torch.argsort(est, descending=True)
                    st["l" + side] = est[order]
                    Q = Q[:, order]
                    st["v"] = st["v"][order, :] if side == "L" else st["v"][:, order]
                    st["Q" + side] = torch.linalg.qr(F @ Q)[0]


# ---------------------------------------------------------------- element-wise
class Ember(Opt):
    def step(self, grads, lr):
        c = self.cfg
        self.t += 1
        b2 = c["beta2"]
        for W, g, st in zip(self.params, grads, self.state):
            V, D = W.shape
            r = st.setdefault("r", torch.zeros(V, dtype=DT))
            col = st.setdefault("c", torch.zeros(D, dtype=DT))
            r.mul_(b2).add_(g.pow(2).mean(dim=1), alpha=1 - b2)
            # col_mean "all" (katop1234/ember's c = sum_i g^2 / n_rows) or "active" (rows with a gradient)
            if c.get("col_mean", "all") == "active":
                n_rows = max(int((g.abs().sum(dim=1) > 0).sum()), 1)
            else:
                n_rows = V
            col.mul_(b2).add_(g.pow(2).sum(dim=0) / n_rows, alpha=1 - b2)
            bc = 1 - b2**self.t
            rh, ch = r / bc, col / bc
            denom = (rh.unsqueeze(1) * ch.unsqueeze(0) / rh.mean().clamp(min=1e-30)).sqrt() + c["eps"]
            W.mul_(1 - lr * c["weight_decay"]).sub_(lr * g / denom)


class AdamS(Opt):
    def step(self, grads, lr):
        c = self.cfg
        self.t += 1
        for W, g, st in zip(self.params, grads, self.state):
            m = st.setdefault("m", torch.zeros_like(W))
            v = c["beta2"] * m * m + (1 - c["beta2"]) * g * g
            m.mul_(c["beta1"]).add_(g, alpha=1 - c["beta1"])
            wd = c["weight_decay"] if W.dim() >= 2 else 0.0
            W.mul_(1 - lr * wd).sub_(lr * m / (v.sqrt() + c["eps"]))


class Lion(Opt):
    def step(self, grads, lr):
        c = self.cfg
        self.t += 1
        for W, g, st in zip(self.params, grads, self.state):
            m = st.setdefault("m", torch.zeros_like(W))
            u = torch.sign(c["beta1"] * m + (1 - c["beta1"]) * g)
            wd = c["weight_decay"] if W.dim() >= 2 else 0.0
            W.mul_(1 - lr * wd).sub_(lr * u)
            m.mul_(c["beta2"]).add_(g, alpha=1 - c["beta2"])


class AdamW(Opt):
    def step(self, grads, lr):
        c = self.cfg
        self.t += 1
        for W, g, st in zip(self.params, grads, self.state):
            m = st.setdefault("m", torch.zeros_like(W))
            v = st.setdefault("v", torch.zeros_like(W))
            m.mul_(c["beta1"]).add_(g, alpha=1 - c["beta1"])
            v.mul_(c["beta2"]).addcmul_(g, g, value=1 - c["beta2"])
            mh = m / (1 - c["beta1"] ** self.t)
            vh = v / (1 - c["beta2"] ** self.t)
            wd = c["weight_decay"] if W.dim() >= 2 else 0.0
            W.mul_(1 - lr * wd).sub_(lr * mh / (vh.sqrt() + c["eps"]))


ALGOS = {"muon": Muon, "prmuon": PRMuon, "dion3": Dion3, "soap": Soap, "ember": Ember, "adams": AdamS,
         "lion": Lion, "adamw": AdamW}


def main():
    src, dst = sys.argv[1], sys.argv[2]
    tensors, meta = load_st(src)
    cfg = json.loads(meta["config"])
    n = 0
    while f"p{n}.w0" in tensors:
        n += 1
    params = [tensors[f"p{i}.w0"].to(DT).clone() for i in range(n)]
    opt = ALGOS[cfg["algo"]](cfg, params)
    for t in range(cfg["steps"]):
        grads = [tensors[f"p{i}.g{t}"].to(DT) * cfg["grad_scale"] for i in range(n)]
        opt.step(grads, cfg["lr"] * cfg["lr_scale"])
    save_st(dst, {f"p{i}.w": params[i] for i in range(n)})


if __name__ == "__main__":
    main()
