"""Reproduces harness case linear_attn-bf16-B2-T65-H2-K64-V64-h0_grad-normal-s0-normalize.

Function under test: harness.upstream:fla_chunk_linear_attn, in place of variant chunk (fla_kernels.ops.linear_attn:chunk_linear_attn).

The script stands alone (no harness import). It draws the case's inputs exactly as the harness
does, bit for bit, runs forward and backward of the function under test, computes the float64
golden (the op's reference loop, its chunked form beyond SPEC.loop_max_T steps, on the inputs upcast
exactly) and the same-dtype baseline (the chunked reference with its matrix-product operands in
bf16, as a straightforward kernel would compute it), and prints one line per output and
gradient: the numbers a sweep reports for it.

Run it where fla_kernels and references import (the repository root, or after pip install -e .):

    python fla060_chunk_linear_attn_normalize_o_float32.py
        one line per output and gradient; exit status 0 if all pass, 1 if any fails
    python -i fla060_chunk_linear_attn_normalize_o_float32.py
        the same, then a prompt to inspect results, golden and baseline (dicts of tensors
        by name), inputs and metrics

Columns, per tensor X, with X64 its golden and Xb its baseline:
    err           max|X - X64|
    baseline err  max|Xb - X64|: what computing in the case's dtype costs anyway
    floor         max|X64.to(dtype) - X64|: the rounding of the golden itself into the dtype X
                  must be returned in (EXPECTED_DTYPES)
    bound         factor * baseline err + floor_factor * floor + atol (TOLERANCES)
    NaN, Inf      counts, and the first bad (b, t, h) where the golden is finite
    verdict       PASS if err <= bound and no NaN/Inf where the golden is finite, else FAIL
                  (ERROR: the baseline itself is not finite, so there is no bound)
"""
from __future__ import annotations

import functools
import importlib
import math
import os
import sys
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    # Without a GPU, Triton kernels run in its CPU interpreter; the switch precedes their import.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from harness.upstream import fla_chunk_linear_attn as function_under_test  # noqa: E402


# The case ---------------------------------------------------------------------------------------
TARGET = "harness.upstream:fla_chunk_linear_attn"  # the function under test, as module:function
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEGMENTS = None  # None: one call; else the (start, end) steps of each chained call
DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
MIXED_DTYPES = {'bf16-fp32gates': ('bf16', 'fp32'), 'fp16-fp32gates': ('fp16', 'fp32')}
SHAPE = ('B', 'T', 'H', 'K', 'V', 'M')
CORE_SYMBOLS = ('B', 'T', 'H', 'K', 'V')
CHUNK = 64
OWN_SYMBOLS = ('M',)
GATES = {'normal': 1.0, 'strong': 0.05, 'weak': 16.0, 'extreme': None}
EXTREME_GATE = -60.0


# The case core: the harness's own code, copied verbatim. The op's declaration (SPEC) and the
# case (CASE) below say what is drawn and run; make_inputs draws the inputs exactly as the
# harness does, bit for bit; run_implementation runs forward and backward; golden_and_baseline
# gives the float64 golden (the op's reference loop, its chunked form beyond SPEC.loop_max_T
# steps) and the same-dtype baseline (the chunked reference with its products' operands in the
# case's dtype, in chunks of SPEC.baseline_chunk_size).
@dataclass(frozen=True)
class InputSpec:
    """One input tensor: its name and shape in terms of the case's shape symbols."""
    name: str
    shape: tuple            # symbols among CORE_SYMBOLS and the op's own `symbols`
    kind: str = "randn"     # "randn", "gate" (log gate: logsigmoid(randn) / normaliser) or
                            # "positive" (elu(randn) + 1, a positive feature map's output)
    optional: bool = False  # the op also accepts None here (its gradient is then None)
    grad: bool = True       # the op gives its gradient (False: a constant, as simple GLA's g_gamma)


@dataclass(frozen=True)
class StateSpec:
    """One recurrent state: its name ("h" gives tensors "ht" and "dh0") and shape: symbols, or
    integers for fixed sizes (linear attention's normaliser z [B, 1, H, K])."""
    name: str
    shape: tuple


@dataclass(frozen=True)
class OptionSpec:
    """A call option of the op beyond its core call (linear attention's normalize=True, simple
    GLA's constant decay g_gamma): what the call gains or loses. Under an option the op is
    `OpSpec.under(name)`: its inputs, states and call keywords as changed here."""
    meaning: str
    kwargs: dict = field(default_factory=dict)   # keyword arguments of the call
    inputs: tuple = ()                           # InputSpec appended to the positional inputs
    without: tuple = ()                          # inputs passed as None
    states: tuple = ()                           # StateSpec appended to the op's states
    chainable: bool = True   # segments chained through the final state equal one call
    kinds: dict = field(default_factory=dict)    # input -> how it is drawn under the option


@dataclass(frozen=True)
class Symbol:
    """A shape symbol of the op's own beyond CORE_SYMBOLS (gsa's slots M): its values per preset
    and the bench's default. It is a column of every results CSV (reports/schema.SHAPE); ops
    without it record 0."""
    meaning: str
    presets: dict           # preset name -> the values a sweep takes
    bench: int              # `harness bench`'s default


@dataclass(frozen=True)
class LayerSpec:
    """The op's torch.nn layer ("module:Class") and the constructor arguments taken from the
    case's symbols beyond the heads ({"num_slots": "M"})."""
    target: str
    symbol_args: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: tuple                     # InputSpec, in positional order of the public functions
    variants: dict                    # variant -> "module:function" (`kernels` writes the usual ones)
    reference_loop: str = ""          # "module:function", the float64 definition
    reference_chunked: str = ""       # "module:function", same numbers, fast for long T
    states: tuple = (StateSpec("h", ("B", "H", "K", "V")),)   # more than one: passed as tuples
    symbols: dict = field(default_factory=dict)   # symbol -> Symbol, beyond CORE_SYMBOLS
    loop_max_T: int = 256             # above this the golden comes from the chunked form
    baseline_chunk_size: int = 64     # the chunk of the same-dtype baseline: production kernels' size
    description: str = ""
    layer: LayerSpec | None = None
    upstream: dict = field(default_factory=dict)  # set ("fla") -> {variant: "module:function"}
    # (tensor, dtype) -> {"factor" / "atol" / "floor_factor": ..., "reason": ...}; "*" matches any
    tolerances: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)   # name -> OptionSpec, beyond "<input>=None"
    declared_in: str = ""             # the declaring module (set by the registry)
    option: str = "none"              # the option this is the op under (`under`)
    base: OpSpec | None = field(default=None, repr=False, compare=False)  # the op without it

    def __post_init__(self):
        """References default to references/<op>.py's <op>_recurrent and <op>_chunked."""
        if not self.reference_loop:
            object.__setattr__(self, "reference_loop", f"references.{self.name}:{self.name}_recurrent")
        if not self.reference_chunked:
            object.__setattr__(self, "reference_chunked", f"references.{self.name}:{self.name}_chunked")

    def all_options(self) -> dict:
        """Every option of the op: "<input>=None" for each optional input (passed as None), then
        the declared ones (which may redefine those)."""
        core = self.base or self
        implied = {f"{s.name}=None": OptionSpec(f"{s.name} passed as None", without=(s.name,))
                   for s in core.inputs if s.optional}
        return {**implied, **core.options}

    def under(self, option: str) -> OpSpec:
        """The op called with `option` ("none": the core call): inputs and states extended as
        the option says, `option` naming it."""
        core = self.base or self
        if option == self.option:
            return self
        if option == "none":
            return core
        options = core.all_options()
        if option not in options:
            known = ", ".join(options) or "none"
            raise ValueError(f"op '{core.name}' has no option '{option}'; its options: {known}.")
        extra = options[option]
        inputs = tuple(replace(s, kind=extra.kinds.get(s.name, s.kind)) for s in core.inputs)
        return replace(core, inputs=inputs + extra.inputs, states=core.states + extra.states,
                       option=option, base=core)

    def option_spec(self) -> OptionSpec:
        """The option the op is under (an empty one for the core call)."""
        return OptionSpec("the core call") if self.option == "none" else self.all_options()[self.option]

    def variant_fn(self, variant: str) -> Callable:
        return load_function(self.variants[variant])

    def shape_of(self, spec: InputSpec | StateSpec, dims: dict) -> tuple:
        """The sizes of an input's or state's shape under `dims` (symbol -> size)."""
        return tuple(dims[s] if isinstance(s, str) else s for s in spec.shape)

    def used_symbols(self) -> tuple:
        """Every shape symbol the op's inputs and states use, core ones first."""
        used = {s for x in self.inputs + self.states for s in x.shape if isinstance(s, str)}
        return tuple(s for s in CORE_SYMBOLS if s in used) + tuple(sorted(used - set(CORE_SYMBOLS)))

    def gates(self) -> tuple:
        """The inputs that are log gates."""
        return tuple(s.name for s in self.inputs if s.kind == "gate")

    def sequence_inputs(self) -> set:
        """The inputs with a time axis ([B, T, ...]), which segments and packing cut."""
        return {s.name for s in self.inputs if tuple(s.shape[:2]) == ("B", "T")}

    def final_state_names(self) -> list:
        return [s.name + "t" for s in self.states]

    def initial_state_grad_names(self) -> list:
        return ["d" + s.name + "0" for s in self.states]


def load_function(target: str) -> Callable:
    """Import 'package.module:function'; raise ValueError with a plain sentence if it cannot."""
    if target.count(":") != 1:
        raise ValueError(f"'{target}' is not of the form module:function.")
    module_name, fn_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module '{module_name}': {exc}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"module '{module_name}' has no function '{fn_name}'.")
    return fn


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    B: int
    T: int
    H: int
    K: int
    V: int
    h0: str
    gate: str
    seed: int
    M: int = 0    # one field per OWN_SYMBOLS
    varlen: str = "none"   # one of VARLEN
    option: str = "none"   # the op's option (`OpSpec.all_options`), "none" for its core call

    @property
    def case_id(self) -> str:
        own = "".join(f"-{s}{getattr(self, s)}" for s in OWN_SYMBOLS if getattr(self, s))
        call = "".join(f"-{v}" for v in (self.varlen, self.option) if v != "none")
        return (f"{self.op}-{self.dtype}-B{self.B}-T{self.T}-H{self.H}-K{self.K}-V{self.V}{own}"
                f"-h0_{self.h0}-{self.gate}-s{self.seed}{call}")

    @property
    def activation_dtype(self) -> str:
        """The dtype of q, k, v and the output ("bf16" of "bf16-fp32gates")."""
        return MIXED_DTYPES[self.dtype][0] if self.dtype in MIXED_DTYPES else self.dtype

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.activation_dtype]

    @property
    def gate_dtype(self) -> torch.dtype:
        """The dtype of the log gates: the activations' unless the dtype mixes them."""
        return DTYPES[MIXED_DTYPES[self.dtype][1]] if self.dtype in MIXED_DTYPES else self.torch_dtype

    @property
    def packed(self) -> bool:
        return self.varlen == "packed"

    def dims(self) -> dict:
        return {s: getattr(self, s) for s in SHAPE}

    def as_dict(self) -> dict:
        return asdict(self)


def sequence_count(B: int, gen: torch.Generator) -> int:
    """How many sequences a packed case of B rows cuts its tokens into: B and one to four more,
    so that a packed batch has more sequences than the plain one has rows."""
    return B + 1 + _draw(gen, 3)


def sequence_lengths(total: int, count: int, gen: torch.Generator) -> list[int]:
    """The lengths of `count` sequences (fewer if `total` is shorter) of a packed case of `total`
    tokens, drawn from `gen`: one of length 1, one longer than a chunk where `total` leaves room
    for it, the others of random unequal lengths (so boundaries fall inside chunks), in random
    order."""
    count = min(count, total)
    if count == 1:
        return [total]
    fixed, left, others = [1], total - 1, count - 1
    room = left - (others - 1)          # what the long one may take, the others keeping a token each
    if others > 1 and room > CHUNK + 1:
        long = CHUNK + 1 + _draw(gen, (room - CHUNK - 1) // 2)
        fixed.append(long)
        left, others = left - long, others - 1
    cuts = sorted((torch.randperm(left - 1, generator=gen)[:others - 1] + 1).tolist())
    rest = [b - a for a, b in zip([0, *cuts], [*cuts, left])]
    lengths = fixed + rest
    order = torch.randperm(len(lengths), generator=gen).tolist()
    return [lengths[i] for i in order]


def _draw(gen: torch.Generator, high: int) -> int:
    """An integer in [0, high]."""
    return int(torch.randint(0, high + 1, (1,), generator=gen))


def cu_seqlens_of(lengths: list[int], device) -> torch.Tensor:
    """The cumulative starts [0, l0, l0 + l1, ..., total], int32, as the library takes them."""
    starts = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return starts.to(device)


def per_sequence(fn, spec):
    """`fn`, a function of the op on batches of whole sequences, as one that takes packed inputs
    (`cu_seqlens`, B = 1, states [N, ...]): it calls `fn` once per sequence (B = 1, that sequence's
    tokens and initial state) and packs what the calls return (o along T, final states along N).
    Inputs without a time axis (rwkv6's u) go to every call whole."""
    sequence_inputs = spec.sequence_inputs()
    names = [s.name for s in spec.inputs]
    single = len(spec.states) == 1

    @functools.wraps(fn)
    def packed(*args, cu_seqlens, initial_state=None, output_final_state=False, **kwargs):
        bounds = cu_seqlens.tolist()
        outputs, finals = [], []
        for n, (t0, t1) in enumerate(zip(bounds, bounds[1:])):
            pieces = [x[:, t0:t1] if name in sequence_inputs and x is not None else x
                      for name, x in zip(names, args)]
            h0 = None
            if initial_state is not None:
                h0 = initial_state[n:n + 1] if single else tuple(s[n:n + 1] for s in initial_state)
            o, final = fn(*pieces, initial_state=h0, output_final_state=output_final_state, **kwargs)
            outputs.append(o)
            finals.append((final,) if single else final)
        o = torch.cat(outputs, dim=1)
        if not output_final_state:
            return o, None
        stacked = tuple(torch.cat(parts, dim=0) for parts in zip(*finals))
        return o, stacked[0] if single else stacked

    return packed


@dataclass
class CaseInputs:
    tensors: dict            # name -> tensor in the case dtype (positional inputs of the op)
    initial_states: tuple    # float32 tensors, one per state of the op, or None
    do: torch.Tensor         # upstream gradient of o, case dtype
    dhts: tuple              # upstream gradients of the final states, float32
    scale: float | None      # None: the implementation's default (K ** -0.5)
    dims: dict = None        # the sizes of the call: the case's, or B = 1 and T = B * T when packed
    state_dims: dict = None  # the sizes of the states: `dims` with B the number of sequences
    cu_seqlens: torch.Tensor | None = None   # int32 [N + 1] sequence starts of a packed case

    @property
    def bounds(self) -> list[int] | None:
        """The packed sequences' starts and the end, or None (not packed)."""
        return None if self.cu_seqlens is None else self.cu_seqlens.tolist()

    @property
    def longest(self) -> int:
        """The longest sequence's length: T, or the longest packed sequence's."""
        bounds = self.bounds
        return self.dims["T"] if bounds is None else max(b - a for a, b in zip(bounds, bounds[1:]))


def _generator(case: Case) -> torch.Generator:
    """A CPU generator seeded by the recorded seed and the case's shape, so inputs are device-independent."""
    key = f"{case.seed}-{case.B}-{case.T}-{case.H}-{case.K}-{case.V}-{case.M}-{case.dtype}-{case.gate}"
    return torch.Generator().manual_seed(zlib.crc32(key.encode()))


def packed_lengths(case: Case, gen: torch.Generator | None = None) -> list[int]:
    """The sequence lengths of a packed case (`sequence_lengths`), from a generator of their own
    seeded from the case's (or `gen`'s), so the tensors drawn are the unpacked case's in one row."""
    own = torch.Generator().manual_seed((_generator(case) if gen is None else gen).initial_seed() + 1)
    return sequence_lengths(case.B * case.T, sequence_count(case.B, own), own)


def make_inputs(spec: OpSpec, case: Case, device, generator: torch.Generator | None = None) -> CaseInputs:
    """Draw every input in float32 on the CPU, round it to the case dtype (gates to the gates'
    dtype), move it to `device`: the inputs in call order, the initial states (unless case.h0 is
    "none"), do, the dhts, then the inputs the case's option adds and, for a packed case, the
    sequence lengths (so the core inputs are the same numbers under every option and packing).
    `generator`: the CPU generator to draw from (default: the case's own, `_generator`)."""
    spec = spec.under(case.option)
    gen = _generator(case) if generator is None else generator
    dims = case.dims()
    if case.packed:
        dims.update(B=1, T=case.B * case.T)

    def draw(shape, kind="randn"):
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        if kind == "gate":
            x = torch.full_like(x, EXTREME_GATE) if GATES[case.gate] is None else F.logsigmoid(x) / GATES[case.gate]
        elif kind == "positive":
            x = F.elu(x) + 1
        return x.to(case.gate_dtype if kind == "gate" else case.torch_dtype).to(device)

    extra = spec.option_spec()
    tensors = {s.name: draw(spec.shape_of(s, dims), s.kind) for s in spec.inputs if s not in extra.inputs}
    lengths = packed_lengths(case, gen) if case.packed else []
    state_dims = {**dims, "B": len(lengths)} if case.packed else dims
    core_states = [s for s in spec.states if s not in extra.states]

    def states(specs):
        return [torch.randn(spec.shape_of(s, state_dims), generator=gen, dtype=torch.float32).to(device)
                for s in specs]

    h0 = states(core_states) if case.h0 != "none" else None
    do = draw((dims["B"], dims["T"], case.H, case.V))
    dhts = states(core_states)
    tensors.update({s.name: draw(spec.shape_of(s, dims), s.kind) for s in extra.inputs})
    h0 = None if h0 is None else tuple(h0 + states(extra.states))
    dhts = tuple(dhts + states(extra.states))
    tensors = {s.name: tensors[s.name] for s in spec.inputs}
    return CaseInputs(tensors=tensors, initial_states=h0, do=do, dhts=dhts, scale=case.K ** -0.5,
                      dims=dims, state_dims=state_dims,
                      cu_seqlens=cu_seqlens_of(lengths, device) if case.packed else None)


@dataclass
class Execution:
    """What one forward and backward of an implementation gave."""
    result: dict   # tensor name ("o", "ht", "dq", "dh0", ...) -> output or gradient (None if absent)
    given: dict    # input name -> (the tensor the implementation received, the original it copies)


class RunFailed(Exception):
    """An implementation's run stopped before its gradients: it returned something the op does not
    (`tensor` names it), or its backward raised. `forward` holds the outputs it returned that
    match the op, which are still compared with the golden."""

    def __init__(self, message: str, forward: dict, tensor: str = ""):
        super().__init__(message)
        self.forward, self.tensor = forward, tensor


def _shape_text(shape, symbols) -> str:
    return f"({', '.join(map(str, shape))}) [{', '.join(map(str, symbols))}]"


def returned_problems(spec: OpSpec, inputs: CaseInputs, returned, t0: int, t1: int) -> tuple[dict, dict]:
    """({name: tensor} of the forward outputs that match the op, {name: why} of those that do not)
    for what one call over steps [t0, t1) returned: (o, final state), with o [B, t1 - t0, H, V]
    and each state its declared shape (one per packed sequence), floating point."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        what = type(returned).__name__ + (f" of {len(returned)}" if isinstance(returned, (tuple, list)) else "")
        return {}, {"o": f"the call returned a {what}; the op returns the pair (o, final state)"}
    o, finals = returned
    dims = {**inputs.dims, "T": t1 - t0}
    wanted = [("o", o, ("B", "T", "H", "V"), dims)]
    if finals is not None:
        finals_tuple = (finals,) if len(spec.states) == 1 else finals
        if not isinstance(finals_tuple, (tuple, list)) or len(finals_tuple) != len(spec.states):
            return ({}, {spec.final_state_names()[0]: f"the final state is a {type(finals).__name__}; "
                         f"the op's is a tuple of {len(spec.states)} tensors"})
        wanted += [(name, x, st.shape, inputs.state_dims) for name, x, st in
                   zip(spec.final_state_names(), finals_tuple, spec.states)]
    good, bad = {}, {}
    for name, x, symbols, sizes in wanted:
        expected = tuple(sizes[d] if isinstance(d, str) else d for d in symbols)
        if x is None and name != "o":
            good[name] = None
        elif not isinstance(x, torch.Tensor):
            bad[name] = f"{name} is a {type(x).__name__}, not a tensor"
        elif not x.is_floating_point():
            bad[name] = f"{name} is {str(x.dtype).replace('torch.', '')}, not floating point"
        elif tuple(x.shape) != expected:
            bad[name] = (f"{name} has shape {_shape_text(tuple(x.shape), symbols)}; the op's is "
                         f"{_shape_text(expected, symbols)}")
        else:
            good[name] = x
    return good, bad


def run_implementation(fn, spec: OpSpec, case: Case, inputs: CaseInputs, to_dtype=None,
                       segments=None, final_state="grad", without=(), h0_grad=True,
                       requires_grad=None, o_in_loss=True) -> Execution:
    """Forward and backward with the shared upstream gradients.

    Inputs are cloned first (optionally cast to `to_dtype`), so no implementation sees another's
    tensors; `given` keeps the copies to check afterwards that none was written to. An op with one
    state takes and returns it as a tensor, with several as tuples. With `segments` ([(t0, t1)...])
    the forward runs once per segment of T, each taking the previous one's final state, and the
    backward runs through the whole chain. final_state: "grad" (returned, its upstream gradient in
    the loss), "unused" (returned, not in the loss) or "off" (output_final_state=False); the
    inputs named in `without` are passed as None; h0_grad=False passes a case's initial state
    without requires_grad; `requires_grad` names the inputs whose gradients are taken (default
    all); o_in_loss=False leaves o out of the loss (only the final states' gradients flow).
    Initial states and their upstream gradients stay float32 unless `to_dtype` is float64 (a
    golden). The case's option (`OpSpec.under`) adds its keywords and inputs and passes its
    `without` inputs as None; a packed case passes `cu_seqlens`. What each call returns is checked against the op before anything
    else uses it: RunFailed names a wrong shape or type, and a backward that raises.
    """
    spec = spec.under(case.option)
    option = spec.option_spec()
    without = tuple(without) + option.without
    call = dict(option.kwargs)
    if inputs.cu_seqlens is not None:
        if segments:
            raise ValueError("a packed case is not cut into segments")
        call["cu_seqlens"] = inputs.cu_seqlens
    state_dtype = torch.float64 if to_dtype == torch.float64 else None

    def upstream(x, dtype=to_dtype):
        return x.detach().clone() if dtype is None else x.detach().to(dtype)

    def leaf(x, grad=True, dtype=to_dtype):
        return upstream(x, dtype).requires_grad_(grad)

    single = len(spec.states) == 1
    differentiable = {s.name for s in spec.inputs if s.grad}
    leaves = {name: leaf(x, name in differentiable and (requires_grad is None or name in requires_grad))
              for name, x in inputs.tensors.items() if name not in without}
    given = {name: (x, inputs.tensors[name]) for name, x in leaves.items()}
    h0 = None
    if inputs.initial_states is not None:
        h0 = tuple(leaf(x, case.h0 == "grad" and h0_grad, state_dtype) for x in inputs.initial_states)
        given.update({f"initial {s.name}": (x, orig) for s, x, orig in
                      zip(spec.states, h0, inputs.initial_states)})
    sequence = spec.sequence_inputs()
    T = inputs.dims["T"]
    pieces, finals = [], h0
    for t0, t1 in segments or [(0, T)]:
        args = [leaves.get(name) for name in inputs.tensors]
        args = [x[:, t0:t1] if name in sequence and x is not None else x
                for name, x in zip(inputs.tensors, args)]
        state = None if finals is None else (finals[0] if single else finals)
        returned = fn(*args, scale=inputs.scale, initial_state=state,
                      output_final_state=final_state != "off" or t1 < T, **call)
        good, bad = returned_problems(spec, inputs, returned, t0, t1)
        if bad:
            name, why = next(iter(bad.items()))
            where = f" (segment [{t0}, {t1}))" if segments else ""
            forward = {} if segments else {k: v.detach() for k, v in good.items() if v is not None}
            raise RunFailed(f"returned wrong{where}: {why}", forward, name)
        o, finals = returned
        pieces.append(o)
        finals = (finals,) if single else finals
    o = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
    if finals is None:
        finals = (None,) * len(spec.states)
    do = upstream(inputs.do)
    dhts = tuple(upstream(x, state_dtype) for x in inputs.dhts)
    given["the upstream gradient of o"] = (do, inputs.do)
    outputs, grads = ([o], [do]) if o_in_loss else ([], [])
    for s, final, dht, orig in zip(spec.states, finals, dhts, inputs.dhts):
        given[f"the upstream gradient of {s.name}t"] = (dht, orig)
        if final is not None and final_state == "grad":
            outputs.append(final)
            grads.append(dht)
    result = {"o": o.detach()}
    for name, final in zip(spec.final_state_names(), finals):
        result[name] = None if final is None else final.detach()
    try:
        if outputs:
            torch.autograd.backward(outputs, grads)
    except Exception as exc:
        raise RunFailed(f"backward raised {describe_error(exc)}",
                        {} if segments else {k: v for k, v in result.items() if v is not None}) from exc
    for name, x in leaves.items():
        if name in differentiable:
            result["d" + name] = x.grad
    if case.h0 == "grad" and h0_grad:
        for name, x in zip(spec.initial_state_grad_names(), h0):
            result[name] = x.grad
    return Execution(result, given)


def execute(fn, spec: OpSpec, case: Case, inputs: CaseInputs, to_dtype=None, **options) -> dict:
    """Every output and gradient of one forward and backward (see run_implementation)."""
    return run_implementation(fn, spec, case, inputs, to_dtype, **options).result


def describe_error(exc: BaseException) -> str:
    """One line: the exception's type and the first and last lines of its text (a RunFailed is
    already a sentence of the harness's)."""
    if isinstance(exc, RunFailed):
        return str(exc)[:500]
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if len(lines) <= 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {text}"[:500]


def golden_and_baseline(spec: OpSpec, case: Case, inputs: CaseInputs, cache=None, golden=None,
                        **options) -> tuple[dict, dict]:
    """The float64 golden (loop for short T, chunked form beyond) and the same-dtype baseline,
    taken from `cache` (a GoldenCache) when it has them, and stored there when computed.

    `golden` given: only the baseline is computed (a chain of segments changes the rounding of
    the same-dtype arithmetic, not the float64 truth). A packed case's references run sequence
    by sequence (`per_sequence`)."""
    if cache is not None:
        found = cache.get(spec, case, options, inputs.do.device)
        if found is not None:
            return found
    loop = load_function(spec.reference_loop)
    chunked = load_function(spec.reference_chunked)
    golden_fn = loop if inputs.dims["T"] <= spec.loop_max_T else chunked
    baseline_fn = functools.partial(chunked, operand_dtype=case.torch_dtype,
                                    chunk_size=spec.baseline_chunk_size)
    if case.packed:
        golden_fn, baseline_fn = (per_sequence(f, spec.under(case.option)) for f in (golden_fn, baseline_fn))
    if golden is None:
        golden = execute(golden_fn, spec, case, inputs, to_dtype=torch.float64, **options)
    baseline = execute(baseline_fn, spec, case, inputs, **options)
    if cache is not None:
        cache.put(spec, case, options, golden, baseline)
    return golden, baseline


SPEC = OpSpec(name='linear_attn',
       inputs=(InputSpec(name='q',
                         shape=('B', 'T', 'H', 'K'),
                         kind='randn',
                         optional=False,
                         grad=True),
               InputSpec(name='k',
                         shape=('B', 'T', 'H', 'K'),
                         kind='randn',
                         optional=False,
                         grad=True),
               InputSpec(name='v',
                         shape=('B', 'T', 'H', 'V'),
                         kind='randn',
                         optional=False,
                         grad=True)),
       variants={'chunk': 'fla_kernels.ops.linear_attn:chunk_linear_attn',
                 'fused_chunk': 'fla_kernels.ops.linear_attn:fused_chunk_linear_attn',
                 'fused_recurrent': 'fla_kernels.ops.linear_attn:fused_recurrent_linear_attn'},
       reference_loop='references.linear_attn:linear_attn_recurrent',
       reference_chunked='references.linear_attn:linear_attn_chunked',
       states=(StateSpec(name='h', shape=('B', 'H', 'K', 'V')),),
       symbols={},
       loop_max_T=256,
       baseline_chunk_size=64,
       description='S_t = S_{t-1} + k_t^T v_t; o_t = scale q_t S_t',
       layer=LayerSpec(target='fla_kernels.layers:LinearAttention', symbol_args={}),
       upstream={'fla': {'chunk': 'harness.upstream:fla_chunk_linear_attn',
                         'fused_chunk': 'harness.upstream:fla_fused_chunk_linear_attn',
                         'fused_recurrent': 'harness.upstream:fla_fused_recurrent_linear_attn'}},
       tolerances={},
       options={'normalize': OptionSpec(meaning='o_t / (scale q_t . z_t + 1e-10), z_t the running '
                                                'key sum, a state',
                                        kwargs={'normalize': True},
                                        inputs=(),
                                        without=(),
                                        states=(StateSpec(name='z', shape=('B', 1, 'H', 'K')),),
                                        chainable=True,
                                        kinds={'k': 'positive', 'q': 'positive'})},
       declared_in='fla_kernels.ops.linear_attn.declaration',
       option='none')
CASE = Case(op='linear_attn',
     dtype='bf16',
     B=2,
     T=65,
     H=2,
     K=64,
     V=64,
     h0='grad',
     gate='normal',
     seed=0,
     M=0,
     varlen='none',
     option='normalize')


def run(fn, inputs: CaseInputs, to_dtype=None, segments=None) -> dict:
    """Every output and gradient of one forward and backward of `fn`, as the sweep runs it."""
    return execute(fn, SPEC, CASE, inputs, to_dtype, segments=segments)


def golden_and_baseline_of_case(inputs: CaseInputs) -> tuple[dict, dict]:
    """The golden of one call, and the baseline chained through SEGMENTS when set (where a
    sequence is cut changes the rounding of the baseline, not the float64 truth)."""
    golden, baseline = golden_and_baseline(SPEC, CASE, inputs)
    if SEGMENTS:
        baseline = golden_and_baseline(SPEC, CASE, inputs, golden=golden, segments=SEGMENTS)[1]
    return golden, baseline


# While the function under test runs, memory that code in fla_kernels allocates with torch.empty
# is filled with NaN (the harness's code), so output a kernel forgot to write shows as NaN.
@contextmanager
def nan_filled_allocations(package: str = "fla_kernels"):
    """Within the block, torch.empty-family calls made by code in `package` return float tensors
    filled with NaN, so output a kernel forgot to write reads as NaN instead of stale memory."""
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def poisoned(fn):
        def allocate(*args, **kwargs):
            x = fn(*args, **kwargs)
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if (caller == package or caller.startswith(package + ".")) and x.is_floating_point():
                x.fill_(float("nan"))
            return x
        return allocate

    try:
        for name, fn in originals.items():
            setattr(torch, name, poisoned(fn))
        torch.Tensor.new_empty = poisoned(new_empty)
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = new_empty


# Comparison with the golden ---------------------------------------------------------------------
# The tolerance and compare_to_golden are the harness's code, so the numbers are a sweep's.
@dataclass(frozen=True)
class Tolerance:
    factor: float
    atol: float
    floor_factor: float = 2.0
    ROUNDING = 2.0   # of a floor factor, the final rounding's share; the rest is accumulation (fp32)

    def bound(self, base_err: float, floor: float) -> float:
        return self.factor * base_err + self.floor_factor * floor + self.atol

    def serial_share(self) -> float:
        """The floor factor's share beyond the final rounding: what the tolerance allows each
        element for serial accumulation (fp32); 0 where the floor factor is the rounding alone."""
        return max(self.floor_factor - self.ROUNDING, 0.0)

    def of_sum(self, floor: float, element_floor: float, terms: int) -> tuple["Tolerance", float]:
        """(tolerance, floor) of a sum of `terms` elements of the tensor, whose own rounding is
        `floor`: the bound takes the rounding share of the floor factor (final roundings are
        independent and have no sign), and the floor adds the serial-accumulation share once per
        term (a kernel that accumulates along t in fp32, as a gate gradient's suffix sums do,
        moves neighbouring elements' errors together, so a sum takes each term's allowance
        whole). Bound: factor * the baseline's error of the sum + rounding share * floor + atol."""
        rounding = min(self.floor_factor, self.ROUNDING)
        floor = floor + self.serial_share() * terms * element_floor / rounding
        return Tolerance(self.factor, self.atol, rounding), floor


TENSORS = ["o", "ht", "zt", "dq", "dk", "dv", "dh0", "dz0"]
# The dtype each tensor must come back in: o and the inputs' gradients in TORCH_DTYPE, states float32.
EXPECTED_DTYPES = {
    "o": torch.bfloat16,
    "ht": torch.float32,
    "zt": torch.float32,
    "dq": torch.bfloat16,
    "dk": torch.bfloat16,
    "dv": torch.bfloat16,
    "dh0": torch.float32,
    "dz0": torch.float32,
}
TOLERANCES = {
    "o": Tolerance(factor=2.0, atol=1e-05, floor_factor=2.0),
    "ht": Tolerance(factor=2.0, atol=1e-05, floor_factor=16.1245154965971),
    "zt": Tolerance(factor=2.0, atol=1e-05, floor_factor=16.1245154965971),
    "dq": Tolerance(factor=3.0, atol=1e-05, floor_factor=2.0),
    "dk": Tolerance(factor=3.0, atol=1e-05, floor_factor=2.0),
    "dv": Tolerance(factor=3.0, atol=1e-05, floor_factor=2.0),
    "dh0": Tolerance(factor=3.0, atol=1e-05, floor_factor=16.1245154965971),
    "dz0": Tolerance(factor=3.0, atol=1e-05, floor_factor=16.1245154965971),
}
SEQUENCE_TENSORS = {"o", "dq", "dk", "dv"}  # [B, T, H, ...] tensors: a NaN/Inf is located as (b, t, h)


def _max(x: torch.Tensor) -> float:
    return x.max().item() if x.numel() else 0.0


def first_bad_index(bad: torch.Tensor, seq_layout: bool) -> str:
    """The earliest offending index: (b, t, h) by time for [B, T, H, ...] tensors, else the raw index."""
    idx = bad.nonzero()
    if not len(idx):
        return ""
    if seq_layout and bad.dim() >= 3:
        order = idx[:, 1] * bad.shape[0] * bad.shape[2] + idx[:, 0] * bad.shape[2] + idx[:, 2]
        b, t, h = idx[order.argmin(), :3].tolist()
        return f"(b={b}, t={t}, h={h})"
    return str(tuple(idx[0].tolist()))


def worst_index(diff: torch.Tensor, seq_layout: bool, names: str = "bth") -> str:
    """Where |diff| is largest: (b, t, h) for [B, T, H, ...] tensors (or the leading axes named
    by `names`), else the raw index."""
    if not diff.numel():
        return ""
    idx = torch.unravel_index(diff.flatten().argmax(), diff.shape)
    idx = [int(i) for i in idx]
    if seq_layout and diff.dim() >= len(names):
        return "(" + ", ".join(f"{n}={i}" for n, i in zip(names, idx)) + ")"
    return str(tuple(idx))


def nonfinite_counts(x: torch.Tensor) -> tuple[int, int]:
    return int(torch.isnan(x).sum()), int(torch.isinf(x).sum())


def compare_to_golden(x, gold, base, tol: Tolerance, seq_layout: bool, expected_dtype=None) -> dict:
    """Metrics and verdict of kernel tensor `x` against golden `gold` (float64) and baseline `base`.

    `expected_dtype` is the dtype the public contract promises (default: x's own); the floor is the
    rounding of the golden into it, and a tensor returned in another dtype fails.
    """
    if x is None:
        return _missing(tol)
    if tuple(x.shape) != tuple(gold.shape):
        return {"verdict": "FAIL", "message": f"shape {tuple(x.shape)} differs from the golden's "
                f"{tuple(gold.shape)}", "bound": math.nan, "atol": tol.atol}
    gold_finite = torch.isfinite(gold)
    x64 = x.detach().to(torch.float64)
    nan, inf = nonfinite_counts(x64)
    bad = ~torch.isfinite(x64) & gold_finite
    diff = (x64 - gold).abs().where(gold_finite & ~bad, torch.zeros((), dtype=torch.float64, device=gold.device))
    gold_clean = gold.where(gold_finite, torch.zeros((), dtype=torch.float64, device=gold.device))
    gold_max = _max(gold_clean.abs())
    err = math.inf if bad.any() else _max(diff)
    base_diff = (base.detach().to(torch.float64) - gold_clean).abs()
    base_err = _max(base_diff.where(gold_finite, torch.zeros_like(base_diff)))
    expected_dtype = expected_dtype or x.dtype
    floor = _max((gold_clean.to(expected_dtype).to(torch.float64) - gold_clean).abs())
    bound = tol.bound(base_err, floor)
    rms_gold = gold_clean.pow(2).mean().sqrt().item() if gold.numel() else 0.0
    rms_diff = diff.pow(2).mean().sqrt().item() if gold.numel() else 0.0
    row = {
        "err": err, "rel": err / gold_max if gold_max else (0.0 if err == 0 else math.inf),
        "rms_rel": rms_diff / rms_gold if rms_gold else (0.0 if rms_diff == 0 else math.inf),
        "base_err": base_err, "floor": floor, "atol": tol.atol, "bound": bound,
        "ratio": err / bound if bound else (0.0 if err == 0 else math.inf),
        "nan": nan, "inf": inf, "first_bad": first_bad_index(bad, seq_layout),
    }
    if not math.isfinite(base_err):
        row.update(verdict="ERROR", message="the same-dtype baseline is not finite here, so no bound "
                   "can be formed (a harness problem, not the kernel's)")
    elif x.dtype != expected_dtype:
        row.update(verdict="FAIL", message=f"returned in {_name(x.dtype)}; the contract is {_name(expected_dtype)}")
    elif bad.any():
        row.update(verdict="FAIL", message=f"{nan} NaN and {inf} Inf where the golden is finite; "
                   f"first at {row['first_bad']}")
    elif err > bound:
        row.update(verdict="FAIL", message=_bound_sentence(err, tol, base_err, floor, row["rel"]),
                   first_bad=worst_index(diff, seq_layout))
    else:
        row.update(verdict="PASS", message="")
    return row


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _missing(tol: Tolerance) -> dict:
    return {"verdict": "FAIL", "message": "the implementation returned no tensor (None) where the "
            "golden has one", "atol": tol.atol, "bound": math.nan}


def _bound_sentence(err, tol, base_err, floor, rel) -> str:
    return (f"err {err:.3g} (rel {rel:.3g}) > bound {tol.bound(base_err, floor):.3g} = "
            f"{tol.factor:g} x baseline err {base_err:.3g} + {tol.floor_factor:g} x floor {floor:.3g} "
            f"+ atol {tol.atol:.3g}")


def compare(results: dict, golden: dict, baseline: dict) -> dict:
    """{tensor: its metrics against the golden (err, base_err, floor, bound, ratio, nan, inf,
    first_bad, verdict, message)}."""
    return {name: compare_to_golden(results.get(name), golden[name], baseline[name], TOLERANCES[name],
                                    name in SEQUENCE_TENSORS, EXPECTED_DTYPES[name])
            for name in TENSORS}


# Report -----------------------------------------------------------------------------------------
COLUMNS = [  # metrics key, title, width, format
    ("err", "err", 11, ".3e"), ("base_err", "baseline err", 14, ".3e"), ("floor", "floor", 11, ".3e"),
    ("bound", "bound", 11, ".3e"), ("ratio", "err/bound", 11, ".3g"), ("nan", "NaN", 6, "d"),
    ("inf", "Inf", 6, "d"),
]


def cell(value, width: int, form: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{form}}"


def print_table(metrics: dict):
    """One aligned line per tensor, then the reason for each one that did not pass."""
    print(f"{'tensor':<8}" + "".join(f"{title:>{width}}" for _, title, width, _ in COLUMNS)
          + f"  {'first bad':<20}verdict")
    for name, m in metrics.items():
        print(f"{name:<8}" + "".join(cell(m.get(key), width, form) for key, _, width, form in COLUMNS)
              + f"  {m.get('first_bad') or '-':<20}{m['verdict']}")
    reasons = [f"{name}: {m['message']}" for name, m in metrics.items() if m.get("message")]
    if reasons:
        print("\n" + "\n".join(reasons))


def print_case():
    """What runs: the case, the function, the device, and where golden and baseline come from."""
    how = "one call" if SEGMENTS is None else "segments " + " ".join(f"[{a},{b})" for a, b in SEGMENTS)
    golden = SPEC.reference_loop if CASE.T <= SPEC.loop_max_T else SPEC.reference_chunked
    print(f"case {CASE.case_id}, {how}, on {DEVICE}\nfunction under test: {TARGET}")
    print(f"golden: {golden} in float64; baseline: {SPEC.reference_chunked} with {CASE.dtype} "
          f"operands, chunks of {SPEC.baseline_chunk_size}\n")


if __name__ == "__main__":
    print_case()
    inputs = make_inputs(SPEC, CASE, DEVICE)
    golden, baseline = golden_and_baseline_of_case(inputs)
    with nan_filled_allocations():
        results = run(function_under_test, inputs, segments=SEGMENTS)
    metrics = compare(results, golden, baseline)
    print_table(metrics)
    failed = [name for name, m in metrics.items() if m["verdict"] != "PASS"]
    print(f"\n{'FAIL: ' + ', '.join(failed) if failed else 'PASS'} "
          f"({len(metrics) - len(failed)} of {len(metrics)} tensors within their bounds)")
    if not sys.flags.interactive:  # python -i: stay at the prompt instead
        sys.exit(1 if failed else 0)
