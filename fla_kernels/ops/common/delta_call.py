"""The public call of the delta-rule family's functions: arguments checked, q and k optionally
L2-normalised, then the kernels."""
from __future__ import annotations

import torch

from fla_kernels.ops.common.chunk_delta import WIDEST_KEY_HEAD
from fla_kernels.utils import check_inputs

L2NORM_EPS = 1e-6   # upstream's: x / sqrt(sum(x^2) + eps) over K


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dimension, computed in float32 and kept there (the
    kernels read float32 rows as they read 16-bit ones); differentiable through torch."""
    x = x.to(torch.float32)
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def delta_call(launcher, op: str, q, k, v, beta, g, g_layout, scale, initial_state, output_final_state,
               use_qk_l2norm_in_kernel, cu_seqlens):
    """launcher(q, k, v, beta, g, scale, initial_state, output_final_state, cu_seqlens) on checked
    arguments (`check_inputs`, and K at most WIDEST_KEY_HEAD: ValueError before any launch);
    g_layout: "BTH", "BTHK" or None (no g)."""
    tensors = dict(q=q, k=k, v=v, beta=beta)
    layouts = dict(q="BTHK", k="BTHK", v="BTHV", beta="BTH")
    if g_layout is not None:
        tensors["g"], layouts["g"] = g, g_layout
    sizes = check_inputs(op, tensors, layouts, initial_state=initial_state, cu_seqlens=cu_seqlens)
    if sizes["K"] > WIDEST_KEY_HEAD:
        raise ValueError(f"{op}: K = {sizes['K']} is wider than {WIDEST_KEY_HEAD}, the widest key head "
                         f"these kernels take (upstream's limit too).")
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalise(q), l2_normalise(k)
    scale = sizes["K"] ** -0.5 if scale is None else float(scale)
    return launcher(q, k, v, beta, g, scale, initial_state, output_final_state,
                    cu_seqlens=sizes.get("cu_seqlens"))
