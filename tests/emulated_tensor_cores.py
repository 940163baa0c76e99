"""Run under TRITON_INTERPRET=1 FLA_EMULATE_TENSOR_CORES=1 by `kernel_testing.emulated` (the
switch is read when fla_kernels is imported), or on a GPU's real tensor cores where there is one:
prints one JSON object of results."""
import importlib
import json
import sys

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common import dot
from fla_kernels.ops.common.tiles import load_rows
from harness.cases import Case
from harness.registry import get_op
from harness.runner import Implementation, run_case


@triton.jit
def _product(a, b, c, OPERAND_DTYPE: tl.constexpr):
    o = tl.arange(0, 16)
    x = tl.load(a + o[:, None] * 16 + o[None, :])
    y = tl.load(b + o[:, None] * 16 + o[None, :])
    tl.store(c + o[:, None] * 16 + o[None, :], dot.mma(x, y, False, OPERAND_DTYPE))


@triton.jit
def _product_x3(a, b, c, SPLIT: tl.constexpr):
    o = tl.arange(0, 16)
    x = tl.load(a + o[:, None] * 16 + o[None, :])
    y = tl.load(b + o[:, None] * 16 + o[None, :])
    if SPLIT:
        z = dot.mma_tf32x3(x, y, False)
    else:
        z = dot.mma(x, y, False, tl.float32)
    tl.store(c + o[:, None] * 16 + o[None, :], z)


@triton.jit
def _bf16_once(a, b, FP32_DOT: tl.constexpr):
    """A planted split product that rounds its operands to bf16 once, as a plain 16-bit one does."""
    return dot.mma(a, b, FP32_DOT, tl.bfloat16)


@triton.jit
def _tf32_once(a, b, FP32_DOT: tl.constexpr):
    """A planted split product that rounds its operands to tf32 once, as a plain tf32 one does."""
    return dot.mma(a, b, FP32_DOT, tl.float32)


@triton.jit
def _bf16_for_tf32(a, b, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """A planted `mma` that takes bf16 operands where tf32 ones are asked for (the state walks'
    product of decayed keys before it took tf32 ones, ops/common/chunk_state.py)."""
    if OPERAND_DTYPE == tl.float32:
        return dot.mma(a, b, FP32_DOT, tl.bfloat16)
    else:
        return dot.mma(a, b, FP32_DOT, OPERAND_DTYPE)


@triton.jit
def _unrounded(x, FP32_DOT: tl.constexpr):
    """A planted `tf32_operand` that leaves x unrounded: the products still read it as
    tf32, and the sums formed from x elsewhere no longer see the same number."""
    return x.to(tl.float32)


@triton.jit
def _unit_scales(scales, s_idx, D: tl.constexpr, BD: tl.constexpr, BS: tl.constexpr):
    """A planted `column_scales` that forgets the stored scales: the delta walks read the fp16
    operands as they are stored."""
    return tl.full([BD], 1.0, tl.float32)


@triton.jit
def _unit_tile_scale(scales, s_idx):
    """A planted `tile_scale` that forgets the stored scale: the output kernel and the backward read
    the walk's fp16 states and U as they are stored."""
    return 1.0


@triton.jit
def _unscaled_du_block(du, dus, i_b, i_h, row, i_c, c0, T, NT, H: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BV: tl.constexpr, BVS: tl.constexpr, i_v, FP16_DU: tl.constexpr):
    """A planted `_du_block` that forgets dU's scales: the backward's per-chunk kernels read the
    backward walk's fp16 dU as it is stored."""
    return load_rows(du, row * V, c0, T, H, V, BT, BV, i_v)


PLANTED = {"bf16": _bf16_once, "tf32": _tf32_once, "unrounded": _unrounded}
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SPLIT_PRODUCTS = ("mma_split", "mma_tf32_split")   # what a planted product takes the place of


def products():
    """max |mma - exact product of the rounded operands| and max |mma - exact product|, per dtype."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=gen).to(DEVICE) for _ in range(2))
    out = {}
    for name, tl_dtype, dtype in (("bf16", tl.bfloat16, torch.bfloat16), ("fp16", tl.float16, torch.float16)):
        c = torch.empty(16, 16, device=DEVICE)
        _product[(1,)](a, b, c, tl_dtype)
        rounded = a.to(dtype).double() @ b.to(dtype).double()
        out[name] = [(c.double() - rounded).abs().max().item(),
                     (c.double() - a.double() @ b.double()).abs().max().item()]
    return out


def split_products():
    """max |product - exact| / max |exact| of fp32 matrices (entries spread over 2^-8..2^8) for
    `mma_tf32x3` and for one tf32 product."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=gen) * 2.0 ** torch.randint(-8, 9, (16, 16), generator=gen)
            for _ in range(2))
    exact = a.double() @ b.double()
    out = {}
    for name, split in (("tf32x3", True), ("tf32", False)):
        c = torch.empty(16, 16, device=DEVICE)
        _product_x3[(1,)](a.to(DEVICE), b.to(DEVICE), c, split)
        out[name] = ((c.double().cpu() - exact).abs().max() / exact.abs().max()).item()
    return out


def gate_sums(op, variant, dtype, T, gate, planted):
    """{tensor: (verdict, message)} of the dg rows of one small case; planted: None, or the
    `PLANTED` product that takes the place of the split products in the kernel's module."""
    spec = get_op(op)
    fn = spec.variant_fn(variant)
    if planted:
        module = sys.modules[fn.__module__.rsplit(".", 1)[0] + "." + variant]
        for name in SPLIT_PRODUCTS:
            if hasattr(module, name):
                setattr(module, name, PLANTED[planted])
    case = Case(op=op, dtype=dtype, B=1, T=T, H=2, K=32, V=32, h0="grad", gate=gate, seed=0,
                M=16 if op == "gsa" else 0)
    rows = run_case(spec, case, [Implementation(variant, "ours", fn)], DEVICE, checks=())
    return {r["tensor"]: (r["verdict"], r["message"]) for r in rows if r["tensor"].startswith("dg")}


def case_rows(op, variant, dtype, B, T, H, K, V, gate, varlen, option, checks, planted=""):
    """{"check: tensor": (verdict, err, bound, floor)} of every row of one case of our `variant`
    with the checks named in `checks` (comma-separated, or "none"); planted: "", or
    "KIND@module:name", the `PLANTED` product of that kind in place of the module's split product
    `name`, or several such joined by "+"."""
    for plant in filter(None, planted.split("+")):
        kind, where = plant.split("@")
        module, name = where.split(":")
        setattr(importlib.import_module(module), name, PLANTED[kind])
    spec = get_op(op)
    case = Case(op=op, dtype=dtype, B=int(B), T=int(T), H=int(H), K=int(K), V=int(V), h0="grad",
                gate=gate, seed=0, varlen=varlen, option=option)
    impl = Implementation(variant, "ours", spec.variant_fn(variant))
    names = () if checks == "none" else tuple(checks.split(","))
    rows = run_case(spec, case, [impl], DEVICE, checks=names)
    return {f"{r['check']}: {r['tensor']}": (r["verdict"], r.get("err"), r.get("bound"), r.get("floor"))
            for r in rows}


def walk_error(planted="", variant="chunk"):
    """max |ht - ht64| / max |ht64| of gla's final state from `variant` (chunk or fused_chunk;
    B = 1, T = 64, H = 1, K = V = 32, bf16 inputs, gates logsigmoid(x) / 4) against the float64
    loop on the same inputs; planted "walk_bf16": the state walk's tf32 products take bf16
    operands instead."""
    from fla_kernels.ops.common import chunk_state
    from fla_kernels.ops.gla import chunk_gla, fused_chunk, fused_chunk_gla
    from references.gla import gla_recurrent
    if planted == "walk_bf16":
        chunk_state.mma = fused_chunk.mma = _bf16_for_tf32
    gen = torch.Generator().manual_seed(0)
    q, k, v, x = (torch.randn(1, 64, 1, 32, generator=gen) for _ in range(4))
    q, k, v = (t.bfloat16().to(DEVICE) for t in (q, k, v))
    g = (torch.nn.functional.logsigmoid(x) / 4).bfloat16().to(DEVICE)
    ht = {"chunk": chunk_gla, "fused_chunk": fused_chunk_gla}[variant](q, k, v, g, output_final_state=True)[1]
    ht64 = gla_recurrent(q.double(), k.double(), v.double(), g.double(), output_final_state=True)[1]
    return ((ht.double() - ht64).abs().max() / ht64.abs().max()).item()


def _same(a, b):
    """Whether a kernel's result a is b, the same kernel's with float32 operands: bit for bit
    where the tensor cores are emulated; on a GPU, where the walks' fp16 products sum
    inside the tensor cores otherwise than tf32 ones and the walks carry the last bits on, within
    one bf16 rounding at b's largest magnitude (emulated, fp16 products' sums cut by three bits
    moved delta_rule's dh0 by 4e-5 of its largest and its bf16 gradients by 1.5e-3; a forgotten
    scale moves a result by a power of two)."""
    if DEVICE.type == "cpu":
        return torch.equal(a, b)
    tol = torch.finfo(torch.bfloat16).eps * b.double().abs().max().item()
    return (a.double() - b.double()).abs().max().item() <= tol


def tf32_tiles(planted=""):
    """{op: [o, final state, every gradient the same bit for bit as with float32 operands
    (`TF32_TILES` off), o and final state without autograd those of training, fp16 tiles used]}
    of the chunked delta rule (B = 1, T = 70, H = 1, K = 100, V = 32, bf16, an initial state with
    its gradient; kda, gated_delta_rule and delta_rule); planted "unit_scales": the walks forget
    the scales of their fp16 operands (`_unit_scales`); "unit_state_scales": the output kernel and
    the backward forget those of the walk's fp16 states and U (`_unit_tile_scale`);
    "unscaled_du": those of the backward walk's fp16 dU (`_unscaled_du_block`)."""
    from fla_kernels.ops.common import chunk_delta
    from fla_kernels.ops.delta_rule import chunk_delta_rule
    from fla_kernels.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla_kernels.ops.kda import chunk_kda
    if planted == "unit_scales":
        chunk_delta.column_scales = _unit_scales
    elif planted == "unit_state_scales":
        chunk_delta.tile_scale = _unit_tile_scale
    elif planted == "unscaled_du":
        chunk_delta._du_block = _unscaled_du_block
    flags = []
    launch = chunk_delta.launch

    def recording(kernel, grid, *args, **kwargs):
        flags.append(any(kwargs.get(f"FP16_{x}") for x in ("OPERANDS", "STATES", "DU")))
        return launch(kernel, grid, *args, **kwargs)

    chunk_delta.launch = recording

    def results(fn, inputs, h0, tiles):
        chunk_delta.TF32_TILES = tiles
        leaves = [x.clone().requires_grad_() for x in (*inputs, h0)]
        o, ht = fn(*leaves[:-1], initial_state=leaves[-1], output_final_state=True)
        (o.float().pow(2).sum() + ht.pow(2).sum()).backward()
        with torch.no_grad():
            inference = fn(*inputs, initial_state=h0, output_final_state=True)
        return [o.detach(), ht.detach()], [x.grad for x in leaves], list(inference)

    gen = torch.Generator().manual_seed(0)
    out = {}
    for op, fn, gate_shape in (("kda", chunk_kda, (1, 70, 1, 100)),
                               ("gated_delta_rule", chunk_gated_delta_rule, (1, 70, 1)),
                               ("delta_rule", chunk_delta_rule, None)):
        q, k = (torch.randn(1, 70, 1, 100, generator=gen) for _ in range(2))
        k = torch.nn.functional.normalize(k, dim=-1)
        v = torch.randn(1, 70, 1, 32, generator=gen)
        g = None if gate_shape is None else torch.nn.functional.logsigmoid(torch.randn(gate_shape, generator=gen)) / 4
        beta = torch.rand(1, 70, 1, generator=gen).sigmoid()
        inputs = [t.bfloat16().to(DEVICE) for t in (q, k, v, g, beta) if t is not None]
        h0 = torch.randn(1, 1, 100, 32, generator=gen).to(DEVICE)
        flags.clear()
        outputs, grads, inference = results(fn, inputs, h0, True)
        used = any(flags)
        outputs32, grads32, _ = results(fn, inputs, h0, False)
        out[op] = [_same(outputs[0], outputs32[0]), _same(outputs[1], outputs32[1]),
                   all(_same(a, b) for a, b in zip(grads, grads32)),
                   all(torch.equal(a, b) for a, b in zip(inference, outputs)), used]
    return out


if __name__ == "__main__":
    job = sys.argv[1]
    if job == "products":
        print(json.dumps(products()))
    elif job == "split_products":
        print(json.dumps(split_products()))
    elif job == "case":
        print(json.dumps(case_rows(*sys.argv[2:])))
    elif job == "tf32_tiles":
        print(json.dumps(tf32_tiles(*sys.argv[2:])))
    elif job == "walk":
        print(json.dumps(walk_error(*sys.argv[2:])))
    else:
        op, variant, dtype, T, gate, planted = sys.argv[2:]
        print(json.dumps(gate_sums(op, variant, dtype, int(T), gate, planted if planted in PLANTED else None)))
