"""What an op declares to the harness, in one `OpSpec` next to its kernels
(`fla_kernels/ops/<op>/declaration.py`): its inputs and states with their shape symbols, its
variants and references, its layer, upstream counterparts and tolerance exceptions. Everything the
harness knows of an op (registry, CLI axes, case ids, inputs, CSV columns, bench, repro, layer
check, gate selection, baselines) derives from this. Functions are named as "module:function"
strings and imported only when run, so a declaration is plain data (its repr is Python).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from typing import Callable

CORE_SYMBOLS = ("B", "T", "H", "K", "V")   # every op's; the presets of harness/cases.py sweep them


# kinds drawn in the case's gate dtype: the log gates and what a call computes them from
GATE_KINDS = ("gate", "raw_gate", "A_log", "dt_bias")


@dataclass(frozen=True)
class InputSpec:
    """One input tensor: its name and shape in terms of the case's shape symbols."""
    name: str
    shape: tuple            # symbols among CORE_SYMBOLS and the op's own `symbols`
    kind: str = "randn"     # "randn", "gate" (log gate: logsigmoid(randn) / normaliser),
                            # "positive" (elu(randn) + 1, a positive feature map's output),
                            # "unit" (L2-normalised over the last dim, as layers give keys),
                            # "beta" (a step size in (0, 1)), "logit" (its logit), or a gate the
                            # call computes: "raw_gate", "A_log", "dt_bias"; harness/inputs.py:of_kind
    optional: bool = False  # the op also accepts None here (its gradient is then None)
    grad: bool = True       # the op gives its gradient (False: a constant, as simple GLA's g_gamma)
    keyword: bool = False   # passed by name after the positional inputs (upstream's A_log, dt_bias)


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
    case's symbols beyond the heads ({"num_slots": "M"}); `upstream`: set ("fla") -> (its layer
    "module:Class", its constructor arguments: a string names a size of the case, as
    `harness.upstream_layers.shape_arguments` reads them, anything else is itself)."""
    target: str
    symbol_args: dict = field(default_factory=dict)
    upstream: dict = field(default_factory=dict)


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

    def tensor_shapes(self) -> dict:
        """The symbolic shape of every tensor a run returns: o, the final states, the gradients."""
        shapes = {"o": ("B", "T", "H", "V"), **{"d" + s.name: s.shape for s in self.inputs}}
        for state in self.states:
            shapes[state.name + "t"] = shapes["d" + state.name + "0"] = state.shape
        return shapes


QKV = (InputSpec("q", ("B", "T", "H", "K")), InputSpec("k", ("B", "T", "H", "K")),
       InputSpec("v", ("B", "T", "H", "V")))


def kernels(op: str, *variants: str) -> dict:
    """{variant: "fla_kernels.ops.<op>:<variant>_<op>"}: our kernels, named as the library names them."""
    return {v: f"fla_kernels.ops.{op}:{v}_{op}" for v in variants}


def fla(op: str, *variants: str) -> dict:
    """An `upstream` entry: upstream fla's functions of the same names ("fla.ops.<op>:<variant>_<op>")."""
    return {"fla": {v: f"fla.ops.{op}:{v}_{op}" for v in variants}}


def fla_layer(name: str, by_head_dim: bool = False, **arguments) -> dict:
    """A `LayerSpec.upstream` entry: upstream fla's layer "fla.layers:<name>", its heads sized from
    the case by expansion of the hidden size (key width K, value width V) or, `by_head_dim`, by
    head dimension (the delta-rule layers: head_dim K, expand_v V / K); more `arguments` as given."""
    heads = ({"head_dim": "K", "expand_v": "V/K"} if by_head_dim else {"expand_k": "K/V", "expand_v": 1.0})
    return {"fla": (f"fla.layers:{name}", {"hidden_size": "H*V", "num_heads": "H", **heads, **arguments})}


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
