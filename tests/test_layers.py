"""The layers and their cache: shapes, segments with the cache equal one call (outputs and parameter
gradients), the cache never written into, truncated training segment by segment."""
import pytest
import torch

import dataclasses

import torch.nn.functional as F

from fla_kernels.layers import Cache, DeltaNet, GatedDeltaNet, GatedSlotAttention, KimiDeltaAttention, LinearAttention
from fla_kernels.layers.short_convolution import ShortConvolution
from harness.cases import Case
from harness.checks.layer import layer_class
from harness.declaration import LayerSpec
from harness.runner import Implementation, run_case
from harness.registry import OPS
from tests.kernel_testing import DEVICE

HIDDEN, HEADS = 32, 2
SYMBOL_ARGS = {layer_class(spec): spec.layer.symbol_args for spec in OPS.values() if spec.layer}
# each layer in its first mode: every mode of every layer also goes through the harness's layer
# check (segments through the cache, detached training) in tests/test_checks.py's every-check test
LAYERS = [(cls, next(iter(cls.MODES))) for cls in SYMBOL_ARGS]


def make(cls, mode, seed=0, hidden=HIDDEN, heads=HEADS, **kw):
    torch.manual_seed(seed)
    for arg in SYMBOL_ARGS[cls]:   # gsa's slots
        kw.setdefault(arg, 8)
    return cls(hidden_size=hidden, num_heads=heads, mode=mode, **kw).to(DEVICE)


def inputs(B=2, T=20, seed=1, hidden=HIDDEN):
    torch.manual_seed(seed)
    return torch.randn(B, T, hidden, device=DEVICE)


def assert_close(a, b, what):
    scale = b.abs().max().item() or 1.0
    err = (a - b).abs().max().item()
    assert err <= 1e-4 * scale, f"{what}: max|diff| {err:.3g} against max|x| {scale:.3g}"


@pytest.mark.parametrize("cls,mode", LAYERS, ids=[f"{c.__name__}-{m}" for c, m in LAYERS])
def test_a_call_returns_the_output_no_attentions_and_the_cache(cls, mode):
    """Output shape, no attention weights, and a cache holding the tokens seen. That two calls
    through the cache give one call's output and parameter gradients is the layer check's
    (test_checks: every mode of every layer, against a float64 layer through the same cache)."""
    layer, x = make(cls, mode), inputs()
    y, attentions, cache = layer(x, use_cache=True)
    assert y.shape == x.shape and attentions is None and cache.get_seq_length(0) == x.shape[1]


@pytest.mark.parametrize("cls", [LinearAttention, GatedSlotAttention], ids=lambda c: c.__name__)
def test_the_cache_is_replaced_not_written_into(cls):
    layer, x = make(cls, "chunk"), inputs()
    cache = Cache.from_legacy_cache([layer.init_state(x.shape[0])])
    before = cache[0]
    kept = tuple(s.clone() for s in before) if isinstance(before, tuple) else before.clone()
    _, _, cache = layer(x, use_cache=True, past_key_values=cache)
    after = cache[0]
    assert after is not before
    for old, copy in zip(*(((before,), (kept,)) if not isinstance(before, tuple) else (before, kept))):
        assert torch.equal(old, copy)
    # a zero initial state gives what no state gives
    y0, _, _ = layer(x)
    y1, _, _ = layer(x, past_key_values=[layer.init_state(x.shape[0])])
    assert_close(y1, y0, "output from a zero state")


def test_segment_by_segment_training_with_detached_state():
    """As users train: a forward per segment with the cache, backward per segment after cutting
    the carried state from the graph, one optimizer step at the end: no in-place error, finite
    gradients from every segment, and the step moves the parameters. On a GPU at the size users
    train (hidden 256, 8 heads, 16 slots, segments of 128); smaller under the interpreter."""
    hidden, heads, segment = (256, 8, 128) if DEVICE == "cuda" else (HIDDEN, HEADS, 16)
    layer = make(GatedSlotAttention, "chunk", num_slots=16, hidden=hidden, heads=heads)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1e-2)
    before = {name: p.detach().clone() for name, p in layer.named_parameters()}
    T = 3 * segment
    x = inputs(B=2, T=T, hidden=hidden)
    cache, seen = None, []
    for t0 in range(0, T, segment):
        y, _, cache = layer(x[:, t0:t0 + segment], use_cache=True, past_key_values=cache)
        y.pow(2).mean().backward()
        seen.append(layer.q_proj.weight.grad.clone())
        cache = cache.detach()
        assert not any(s.requires_grad for s in cache[0])
    assert cache.get_seq_length(0) == T
    assert all(g.isfinite().all() for g in seen) and not torch.equal(seen[0], seen[-1])
    optimizer.step()
    assert all(not torch.equal(p, before[name]) for name, p in layer.named_parameters())


@pytest.mark.parametrize("cls,mode", LAYERS, ids=[f"{c.__name__}-{m}" for c, m in LAYERS])
def test_training_with_the_states_detached_in_place(cls, mode):
    """The other way users cut the graph: `detach_()` on every tensor of `cache.states` after each
    segment's backward. The states a kernel returns must be tensors of their own (a view cannot be
    detached in place), and backward must not need them afterwards."""
    layer, x = make(cls, mode), inputs(T=30)
    cache = Cache.from_legacy_cache([layer.init_state(2)])
    for t0 in (0, 10, 20):
        y, _, cache = layer(x[:, t0:t0 + 10], use_cache=True, past_key_values=cache)
        y.pow(2).mean().backward()
        for state in cache.states:
            for tensor in state if isinstance(state, tuple) else (state,):
                tensor.detach_()
                assert not tensor.requires_grad
    assert all(p.grad.isfinite().all() for p in layer.parameters())


def test_bad_mode_and_padding_mask_are_refused():
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        LinearAttention(hidden_size=HIDDEN, num_heads=HEADS, mode="fast")
    layer, x = make(LinearAttention, "chunk"), inputs()
    mask = torch.ones(x.shape[:2], dtype=torch.bool, device=DEVICE)
    mask[0, 0] = False
    with pytest.raises(ValueError, match="padding masks are not supported"):
        layer(x, attention_mask=mask)


def test_short_convolution_is_the_causal_definition_and_carries_its_inputs():
    """y_t = silu(sum_j w_j x_{t-W+1+j}) per channel with zeros before the sequence; fed one token
    at a time with its carried inputs, the same numbers."""
    torch.manual_seed(0)
    conv = ShortConvolution(3, kernel_size=4).double()
    x = torch.randn(2, 9, 3, dtype=torch.float64)
    padded = torch.cat([torch.zeros(2, 3, 3, dtype=torch.float64), x], dim=1)
    w = conv.weight[:, 0, :]
    want = F.silu(torch.stack([(padded[:, t:t + 4] * w.T).sum(1) for t in range(9)], dim=1))
    y, carried = conv(x)
    assert torch.allclose(y, want, rtol=1e-12, atol=1e-14)
    assert torch.equal(carried, x[:, -3:].transpose(1, 2))
    steps, carried = [], None
    for t in range(9):
        step, carried = conv(x[:, t:t + 1], carried)
        steps.append(step)
    assert torch.allclose(torch.cat(steps, dim=1), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cls", [DeltaNet, GatedDeltaNet, KimiDeltaAttention], ids=lambda c: c.__name__)
def test_delta_layers_decoding_token_by_token_give_one_call(cls):
    """Segments of one token, shorter than the convolutions' width, through the cache (as a
    model decodes): the outputs of one call over the sequence."""
    layer, x = make(cls, "fused_recurrent"), inputs(T=6)
    y, _, _ = layer(x)
    cache, steps = None, []
    for t in range(6):
        step, _, cache = layer(x[:, t:t + 1], use_cache=True, past_key_values=cache)
        steps.append(step)
    assert_close(torch.cat(steps, dim=1), y, "output token by token")
    assert len(cache[0]) == 4 and cache[0][1].shape == (2, layer.key_dim, 3)


def test_layer_check_fails_a_convolution_that_forgets_its_carried_inputs():
    """The layer check on DeltaNet: a short convolution that restarts from zeros at every call
    passes one call and fails the float64 layer through the cache against one call (its kernel
    rows pass: their baseline runs through the same layer)."""
    spec = OPS["delta_rule"]
    c = Case(op="delta_rule", dtype="fp32", B=1, T=20, H=1, K=16, V=16, h0="none", gate="normal", seed=0)
    impl = Implementation("fused_recurrent", "ours", spec.variant_fn("fused_recurrent"))

    def layer_rows(layer_target):
        planted = dataclasses.replace(spec, layer=LayerSpec(layer_target))
        return [r for r in run_case(planted, c, [impl], torch.device(DEVICE), checks=("layer",))
                if r["check"] == "layer"]
    good = layer_rows("fla_kernels.layers:DeltaNet")
    assert {"y", "y (segments)", "dq_conv1d.weight (segments)", "float64 segments", "cache"} <= {r["tensor"] for r in good}
    assert all(r["verdict"] == "PASS" for r in good), [(r["tensor"], r["message"]) for r in good
                                                      if r["verdict"] != "PASS"]
    failed = {r["tensor"]: r["message"] for r in layer_rows("tests.planted_layers:DeltaNetForgettingConvolutionInputs")
              if r["verdict"] != "PASS"}
    assert set(failed) == {"float64 segments"}, failed
    assert failed["float64 segments"].startswith("the float64 layer through the cache differs from one call in y")
