"""Upstream's own layers through the layer check (harness/upstream_layers.py), with a stand-in fla
whose GatedLinearAttention is shaped like fla 0.6.0's (tests/stand_in_layers.py): a correct layer
passes every row, and each planted mistake fails its own row."""
import pandas as pd
import pytest

from harness.cli import main
from tests import stand_in_layers
from tests.stand_in_releases import installed


@pytest.fixture()
def layer_release(request, tmp_path, monkeypatch):
    yield from installed(stand_in_layers.release(request.param), tmp_path, monkeypatch)


def layer_rows(tmp_path, variant="fused_recurrent"):
    """The fla layer's rows of one gla case (fp32, B = 2, T = 12, one head of 8) under --impl fla:
    {tensor: (verdict, message)}."""
    out = tmp_path / "out"
    main(["sweep", "--op", "gla", "--impl", "fla", "--variant", variant, "--preset", "cpu", "--dtype", "fp32",
          "--B", "2", "--T", "12", "--H", "1", "--K", "8", "--V", "8", "--h0", "none", "--gate", "normal",
          "--checks", "layer", "--no-golden-cache", "--quiet", "--out", str(out)])
    rows = pd.read_csv(out / "results.csv", keep_default_na=False)
    rows = rows[rows["tensor"].str.startswith("fla layer")]
    return {tensor.removeprefix("fla layer: "): (verdict, message)
            for tensor, verdict, message in zip(rows["tensor"], rows["verdict"], rows["message"])}


@pytest.mark.parametrize("layer_release", [None], indirect=True)
def test_a_correct_upstream_layer_passes_every_row(layer_release, tmp_path):
    rows = layer_rows(tmp_path)
    expected = {"y", "y (segments)", "float64 segments", "cache", "y (padded batch, sequence 0)",
                "y (padded batch, sequence 1)"}
    expected |= {f"d{p}{suffix}" for p in ("q_proj.weight", "k_proj.weight", "v_proj.weight",
                                           "gk_proj.weight", "gk_proj.bias", "g_norm.weight", "o_proj.weight")
                 for suffix in ("", " (segments)")}
    assert set(rows) == expected, set(rows) ^ expected
    assert all(verdict == "PASS" for verdict, _ in rows.values()), rows


@pytest.mark.parametrize("layer_release, failing, message", [
    ("state_stored_transposed", "float64 segments", "the layer loses or misplaces state between calls"),
    ("mask_ignored", "y (padded batch, sequence 1)", "> bound"),
    ("input_written", "x", "the layer wrote into its input"),
], indirect=["layer_release"])
def test_a_planted_layer_mistake_fails_its_own_row(layer_release, tmp_path, failing, message):
    rows = layer_rows(tmp_path)
    assert {tensor for tensor, (verdict, _) in rows.items() if verdict != "PASS"} == {failing}, rows
    assert message in rows[failing][1], rows


@pytest.mark.parametrize("layer_release, failing", [
    ("forward_only", None), ("forward_only+refuses_training", None),
    ("forward_only+state_stored_transposed", "float64 segments"),
    ("forward_only+mask_ignored", "y (padded batch, sequence 1)")], indirect=["layer_release"])
def test_a_forward_only_function_still_has_its_layers_forward_checked(layer_release, failing, tmp_path):
    """An inference kernel (its backward raises NotImplementedError, as fla's fused_recurrent of
    the gated delta rule) is a SKIP for its gradients, and both layers around it are checked in
    their forward, in inference (a layer that refuses training in that mode runs): output, the
    cache across segments, padding; a mistake there still fails."""
    rows = layer_rows(tmp_path)
    forward = {"y", "y (segments)", "float64 segments", "cache", "y (padded batch, sequence 0)",
               "y (padded batch, sequence 1)"}
    assert set(rows) == forward | {"gradients"}, set(rows)
    assert rows["gradients"] == ("SKIP", "the implementation has no backward (its run's row says why): "
                                 "the layer's output, cache and input are checked")
    assert {t for t in forward if rows[t][0] != "PASS"} == ({failing} if failing else set()), rows
    every = pd.read_csv(tmp_path / "out" / "results.csv", keep_default_na=False)
    run = every[every["check"] == "run"]
    assert list(run["verdict"]) == ["SKIP"] and "no backward" in run["message"].iloc[0]
    ours = every[(every["check"] == "layer") & ~every["tensor"].str.startswith("fla layer")]
    assert {"gradients", "y", "y (segments)", "cache"} <= set(ours["tensor"]), set(ours["tensor"])
    assert not ours["tensor"].str.startswith("d").any()
    assert set(ours.loc[ours["tensor"] != "gradients", "verdict"]) == {"PASS"}, ours


@pytest.mark.parametrize("layer_release, failing", [
    ("stateless", None), ("stateless_kwargs", None), ("stateless+input_written", "x")], indirect=["layer_release"])
def test_a_layer_that_keeps_no_cache_has_its_one_call_checked_and_the_rest_skipped(layer_release, failing, tmp_path):
    """fla's LinearAttention before 0.4 returns y alone and names neither a cache nor a mask
    (forward(x), or forward(x, **kwargs) ignoring them): its one call is checked, and the cache
    and padded-batch rows are SKIPs saying why, not ERRORs; a mistake in the one call still fails."""
    rows = layer_rows(tmp_path)
    ones = {"y"} | {f"d{p}" for p in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gk_proj.weight",
                                        "gk_proj.bias", "g_norm.weight", "o_proj.weight")}
    assert set(rows) == ones | {"cache", "padded batch"} | ({failing} if failing else set()), set(rows)
    for row, keyword in (("cache", "past_key_values"), ("padded batch", "attention_mask")):
        verdict, message = rows[row]
        assert verdict == "SKIP" and f"takes no {keyword}" in message and "GatedLinearAttention.forward(" in message
    assert {t for t in ones if rows[t][0] != "PASS"} == set(), rows
    if failing:
        assert rows[failing][0] == "FAIL" and "the layer wrote into its input" in rows[failing][1]


@pytest.mark.parametrize("layer_release", ["unbuildable"], indirect=True)
def test_a_layer_the_release_cannot_build_is_a_skip(layer_release, tmp_path):
    rows = layer_rows(tmp_path)
    assert [verdict for verdict, _ in rows.values()] == ["SKIP"], rows
    assert "fla.layers:GatedLinearAttention in mode fused_recurrent does not build here" in rows["fla layer"][1]


def test_the_golden_takes_a_releases_call_as_the_release_does():
    """Our reference fitted to a release's call: its names (gk for g), V-first states, keywords at
    their defaults or for speed only dropped, any other keyword refused rather than ignored."""
    import torch
    from harness.registry import get_op
    from harness.upstream_layers import as_release_call

    def fla_fn(q, k, v, gk=None, scale=None, initial_state=None, output_final_state=False,
               allow_neg_eigval=False, lower_bound=None, state_v_first=False, cu_seqlens=None,
               cu_seqlens_cpu=None):
        raise AssertionError("the release's own function is not called")

    def reference(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
        return q + g + initial_state[..., 0, 1], initial_state.clone()   # [K, V]: (0, 1) is K 0, V 1

    call = as_release_call(reference, fla_fn, get_op("gla"))
    q = torch.zeros(1, 3, 1, 2)
    state = torch.tensor([[0.0, 1.0], [2.0, 3.0]]).view(1, 1, 2, 2)   # as the release holds it
    o, final = call(q=q, k=q, v=q, gk=q + 5.0, initial_state=state, output_final_state=True,
                    allow_neg_eigval=False, state_v_first=True, cu_seqlens_cpu=[0, 3])
    assert torch.equal(o, q + 7.0) and torch.equal(final, state)   # V first: its (1, 0) is K 0, V 1
    o, final = call(q=q, k=q, v=q, gk=q + 5.0, initial_state=state)
    assert torch.equal(o, q + 6.0)
    with pytest.raises(NotImplementedError, match="with lower_bound, which the golden does not model"):
        call(q=q, k=q, v=q, gk=q, lower_bound=-5.0)


@pytest.mark.parametrize("op", ["gated_delta_rule", "kda"])
def test_the_golden_does_what_a_releases_call_asks_its_kernel_to_do_to_beta_and_g(op):
    """fla's delta-rule layers hand raw beta and g to the kernel with use_beta_sigmoid_in_kernel,
    allow_neg_eigval and use_gate_in_kernel (A_log per head, dt_bias per head and channel): the
    reference gets 2 sigmoid(beta) and -exp(A_log) softplus(g + dt_bias); the gate's lower bound,
    which it does not model, is refused."""
    import torch
    import torch.nn.functional as F
    from harness.registry import get_op
    from harness.upstream_layers import as_release_call

    def fla_fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
               use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, **kwargs):
        raise AssertionError("the release's own function is not called")

    seen = {}

    def reference(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
        seen.update(g=g, beta=beta)
        return q, None

    B, T, H, K = 1, 3, 2, 4
    gen = torch.Generator().manual_seed(0)
    g = torch.randn((B, T, H) + ((K,) if op == "kda" else ()), generator=gen, dtype=torch.float64)
    beta = torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    A_log = torch.randn(H, generator=gen, dtype=torch.float64)
    dt_bias = torch.randn(g.shape[2:].numel(), generator=gen, dtype=torch.float64)
    q = torch.zeros(B, T, H, K, dtype=torch.float64)
    call = as_release_call(reference, fla_fn, get_op(op))
    call(q, q, q, g, beta, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, use_gate_in_kernel=True,
         A_log=A_log, dt_bias=dt_bias)
    for h in range(H):
        expected = -A_log[h].exp() * F.softplus(g[:, :, h] + dt_bias.view(g.shape[2:])[h])
        assert torch.allclose(seen["g"][:, :, h], expected, rtol=1e-15, atol=0)
    assert torch.allclose(seen["beta"], 2 * torch.sigmoid(beta), rtol=1e-15, atol=0)
    call(q, q, q, g, beta)
    assert seen["g"] is g and seen["beta"] is beta
    with pytest.raises(NotImplementedError, match="with lower_bound"):
        call(q, q, q, g, beta, use_gate_in_kernel=True, A_log=A_log, lower_bound=-5.0)
