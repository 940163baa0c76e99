"""How far a delta-rule state rebuilt as a running sum drifts from the recurrence, by T (CPU).

fla 0.6.0's fused_recurrent_delta_rule stores u_t = v_t - S_{t-1}^T k_t in the input dtype in its
forward, and its backward rebuilds S_t = sum_s beta_s k_s u_s^T from those rounded u for dq and
dk. The recurrence itself corrects a perturbed state along each new key; the running sum keeps
every rounding, so its error grows as sqrt(T). This prints, for one head (K = V = 64, keys
L2-normalised, beta from a sigmoid), the state's relative error and max|dq - dq64| at several T
against one rounding of the true dq: what a backward that keeps the recurrence's state can reach.

    python benchmarks/open_loop_state.py [--T 43884]
"""
import argparse

import torch


def true_states(k, v, beta):
    """u_t and S_t of the delta rule in float64 (S_t as float32 to bound memory)."""
    T, K = k.shape
    S = torch.zeros(K, v.shape[1], dtype=torch.float64)
    u = torch.empty_like(v)
    states = torch.empty(T, K, v.shape[1], dtype=torch.float32)
    for t in range(T):
        u[t] = v[t] - k[t] @ S
        S = S + beta[t] * torch.outer(k[t], u[t])
        states[t] = S.float()
    return u, states


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=43884)
    args = parser.parse_args()
    torch.manual_seed(0)
    T, K = args.T, 64
    f64 = dict(dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(T, K, **f64), dim=-1)
    v, do = torch.randn(T, K, **f64), torch.randn(T, K, **f64)
    beta = torch.randn(T, **f64).sigmoid()
    scale = K ** -0.5
    u, states = true_states(k, v, beta)
    dq_true = scale * torch.einsum("tkv,tv->tk", states.double(), do)
    marks = [n for n in (1000, 4096, 16384, 43884, 65536) if n <= T]
    print("dtype     T       state rel err   max|dq err|   one rounding   ratio")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        steps = beta[:, None, None] * k[:, :, None] * u.to(dtype).double()[:, None, :]
        rebuilt = torch.cumsum(steps.float(), 0)
        dq = (scale * torch.einsum("tkv,tv->tk", rebuilt.double(), do)).to(dtype).double()
        rounding = (dq_true.to(dtype).double() - dq_true).abs()
        for n in marks:
            state_err = (rebuilt[n - 1].double() - states[n - 1].double()).norm() / states[n - 1].double().norm()
            err, once = (dq[:n] - dq_true[:n]).abs().max().item(), rounding[:n].max().item()
            print(f"{str(dtype)[6:]:9s} {n:6d}  {state_err.item():13.3g}   {err:11.3g}   {once:12.3g}   {err / once:5.1f}")


if __name__ == "__main__":
    main()
