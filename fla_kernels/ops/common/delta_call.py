"""The public call of the delta-rule family's functions: arguments checked, q and k optionally
L2-normalised, the gate and beta optionally computed from what the layer has, then the kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fla_kernels.ops.common.chunk_delta import WIDEST_KEY_HEAD
from fla_kernels.utils import check_inputs

L2NORM_EPS = 1e-6   # upstream's: x / sqrt(sum(x^2) + eps) over K


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dimension, computed in float32 and kept there (the
    kernels read float32 rows as they read 16-bit ones); differentiable through torch."""
    x = x.to(torch.float32)
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def computed_gate_and_beta(op: str, g, beta, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False):
    """(g, beta) for the kernels from what the call was given, as upstream's calls take them:
    g = -exp(A_log) * softplus(g + dt_bias) per head with use_gate_in_kernel (A_log and dt_bias
    [H]); beta = sigmoid(beta) with use_beta_sigmoid_in_kernel, twice that with allow_neg_eigval
    (eigenvalues of the update down to -1). Computed in float32 through torch, so autograd gives
    dA_log, ddt_bias and the raw inputs' gradients; ValueError for arguments that do not fit."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{op}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True.")
    if use_gate_in_kernel:
        H = g.shape[2]
        given = {"A_log": A_log, **({} if dt_bias is None else {"dt_bias": dt_bias})}   # dt_bias optional
        for name, x in given.items():
            if x is None or tuple(x.shape) != (H,):
                got = "None" if x is None else list(x.shape)
                raise ValueError(f"{op}: use_gate_in_kernel=True takes {name} [H] = [{H}], got {got}.")
        bias = 0 if dt_bias is None else dt_bias.to(torch.float32)
        g = -torch.exp(A_log.to(torch.float32)) * F.softplus(g.to(torch.float32) + bias)
    if use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta.to(torch.float32)) * (2 if allow_neg_eigval else 1)
    return g, beta


def delta_call(launcher, op: str, q, k, v, beta, g, g_layout, scale, initial_state, output_final_state,
               use_qk_l2norm_in_kernel, cu_seqlens, **computed):
    """launcher(q, k, v, beta, g, scale, initial_state, output_final_state, cu_seqlens) on checked
    arguments (`check_inputs`, and K at most WIDEST_KEY_HEAD: ValueError before any launch);
    g_layout: "BTH", "BTHK" or None (no g); `computed`: `computed_gate_and_beta`'s options."""
    tensors = dict(q=q, k=k, v=v, beta=beta)
    layouts = dict(q="BTHK", k="BTHK", v="BTHV", beta="BTH")
    if g_layout is not None:
        tensors["g"], layouts["g"] = g, g_layout
    sizes = check_inputs(op, tensors, layouts, initial_state=initial_state, cu_seqlens=cu_seqlens)
    if sizes["K"] > WIDEST_KEY_HEAD:
        raise ValueError(f"{op}: K = {sizes['K']} is wider than {WIDEST_KEY_HEAD}, the widest key head "
                         f"these kernels take (upstream's limit too).")
    g, beta = computed_gate_and_beta(op, g, beta, **computed)
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalise(q), l2_normalise(k)
    scale = sizes["K"] ** -0.5 if scale is None else float(scale)
    return launcher(q, k, v, beta, g, scale, initial_state, output_final_state,
                    cu_seqlens=sizes.get("cu_seqlens"))
