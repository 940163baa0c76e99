"""`--impl fla`: upstream fla's variants in the place of ours, checked with stand-in `fla` packages
(fla itself needs a GPU driver to autotune) shaped like its releases (tests/stand_in_releases.py),
and the one-line error when fla is missing."""
import sys

import pandas as pd
import pytest
import torch

from harness import upstream
from harness.cli import main
from tests import stand_in_releases as releases
from tests.stand_in_releases import installed

STUB = {
    "fla/__init__.py": "__version__ = '0.6.0'",
    "fla/ops/__init__.py": "",
    "fla/ops/gla/__init__.py": """
        from fla_kernels.ops.gla import chunk_gla, fused_recurrent_gla as _recurrent

        def fused_recurrent_gla(q, k, v, gk=None, gv=None, scale=None, initial_state=None,
                                output_final_state=False, reverse=False, state_v_first=False,
                                cu_seqlens=None, **kwargs):
            assert gv is None and not reverse and not state_v_first and not kwargs
            return _recurrent(q, k, v, gk, scale=scale, initial_state=initial_state,
                              output_final_state=output_final_state, cu_seqlens=cu_seqlens)

        def fused_chunk_gla(**kwargs):
            raise NotImplementedError("`fused_chunk_gla` is deprecated. Please use `chunk_gla` instead.")
    """,
    "fla/ops/linear_attn/__init__.py": """
        from fla_kernels.ops.linear_attn import chunk_linear_attn as _chunk

        def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                              normalize=True):
            assert normalize is False, "the adapter must ask for the unnormalised op"
            return _chunk(q, k, v, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state)
    """,
}


# a release from before the layout change ([B, H, T, ...] unless head_first=False), and one whose
# gated delta rule takes gk and gv before beta (fla 0.3 on)
OLD_RELEASES = {
    "fla/__init__.py": "__version__ = '0.1'",
    "fla/ops/__init__.py": "",
    "fla/ops/gla/__init__.py": """
        from fla_kernels.ops.gla import chunk_gla as _chunk

        def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                      head_first=True):
            if head_first:
                q, k, v, g = (x.transpose(1, 2) for x in (q, k, v, g))
            o, ht = _chunk(q, k, v, g, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state)
            return (o.transpose(1, 2) if head_first else o), ht
    """,
    "fla/ops/linear_attn/__init__.py": """
        from fla_kernels.ops.linear_attn import chunk_linear_attn as _chunk

        def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                              normalize=True, head_first=True):
            assert normalize is False, "the adapter must ask for the unnormalised op"
            if head_first:
                q, k, v = (x.transpose(1, 2) for x in (q, k, v))
            o, ht = _chunk(q, k, v, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state)
            return (o.transpose(1, 2) if head_first else o), ht
    """,
    "fla/ops/simple_gla/__init__.py": """
        from fla_kernels.ops.simple_gla import chunk_simple_gla as _chunk

        def chunk_simple_gla(q, k, v, g=None, scale=None, initial_state=None,
                             output_final_state=False):
            # planted layout mistake: the gate's memory read as [B, H, T]
            g = g.transpose(1, 2).contiguous().view(g.shape)
            return _chunk(q, k, v, g, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state)
    """,
    "fla/ops/gated_delta_rule/__init__.py": """
        from fla_kernels.ops.gated_delta_rule import chunk_gated_delta_rule as _chunk

        def chunk_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                                   initial_state=None, output_final_state=False,
                                   use_qk_l2norm_in_kernel=False, cu_seqlens=None):
            assert gk is None and gv is None, "beta passed where gk is"
            return _chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state,
                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)
    """,
}


@pytest.fixture()
def old_fla(tmp_path, monkeypatch):
    yield from installed(OLD_RELEASES, tmp_path, monkeypatch)


@pytest.fixture()
def stub_fla(tmp_path, monkeypatch):
    yield from installed(STUB, tmp_path, monkeypatch)


@pytest.fixture()
def release(request, tmp_path, monkeypatch):
    """The stand-in release named by the test's parameter (tests/stand_in_releases.py) as fla."""
    yield from installed(getattr(releases, request.param), tmp_path, monkeypatch)


def sweep(tmp_path, op, *extra):
    out = tmp_path / "out"
    code = main(["sweep", "--op", op, "--impl", "fla", "--preset", "smoke", "--dtype", "fp32",
                 "--checks", "none", "--no-golden-cache", "--quiet", "--out", str(out), *extra])
    return code, pd.read_csv(out / "results.csv")


def test_fla_runs_in_place_of_every_variant_it_has(stub_fla, tmp_path):
    code, rows = sweep(tmp_path, "gla")
    assert code == 0
    golden = rows[rows["check"] == "golden"]
    assert dict(zip(golden["variant"], golden["impl"])) == {
        "chunk": "fla.ops.gla:chunk_gla [fla 0.6.0]",
        "fused_recurrent": "fla.ops.gla:fused_recurrent_gla [fla 0.6.0]"}   # the release in every row
    stub = rows[rows["variant"] == "fused_chunk"]   # fla's fused_chunk_gla only raises
    assert list(stub["verdict"]) == ["SKIP"]
    assert "fla 0.6.0's fused_chunk_gla raises NotImplementedError" in stub["message"].iloc[0]


@pytest.mark.parametrize("op,impl", [("gla", "fla.ops.gla:chunk_gla"),
                                     ("linear_attn", "harness.upstream:fla_chunk_linear_attn")])
def test_a_release_before_the_layout_change_is_asked_for_ours(old_fla, tmp_path, op, impl):
    code, rows = sweep(tmp_path, op, "--variant", "chunk")
    assert code == 0, rows[rows["verdict"] != "PASS"][["tensor", "message"]]
    assert set(rows["impl"]) == {f"{impl} [fla 0.1]"}


def test_a_release_with_a_planted_layout_mistake_fails_on_the_right_rows(old_fla, tmp_path):
    code, rows = sweep(tmp_path, "simple_gla", "--variant", "chunk", "--H", "2")
    assert code == 1
    failed = set(rows.loc[(rows["check"] == "golden") & (rows["verdict"] == "FAIL"), "tensor"])
    assert {"o", "dg"} <= failed
    assert not (rows["verdict"] == "ERROR").any()


def test_inputs_a_release_takes_at_other_places_go_by_keyword(old_fla, tmp_path):
    code, rows = sweep(tmp_path, "gated_delta_rule", "--variant", "chunk")
    assert code == 0, rows[rows["verdict"] != "PASS"][["tensor", "message"]]


def test_fitting_leaves_a_call_of_our_order_alone():
    def ours_order(q, k, v, g, beta, scale=None):
        return q, k, v, g, beta, scale
    assert upstream.fitted(ours_order, ["q", "k", "v", "g", "beta"])(1, 2, 3, 4, 5, scale=6) == (1, 2, 3, 4, 5, 6)


def test_linear_attention_is_called_unnormalised(stub_fla, tmp_path):
    code, rows = sweep(tmp_path, "linear_attn", "--variant", "chunk")
    assert code == 0, rows[rows["verdict"] != "PASS"][["tensor", "message"]]
    assert set(rows["impl"]) == {"harness.upstream:fla_chunk_linear_attn [fla 0.6.0]"}
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "implementations under test: `harness.upstream:fla_chunk_linear_attn [fla 0.6.0]`" in summary


def test_asking_for_a_variant_fla_lacks_is_a_usage_error(stub_fla, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(upstream, "targets", lambda name, op: {"chunk": "fla.ops.gla:chunk_gla"})
    code = main(["sweep", "--op", "gla", "--impl", "fla", "--variant", "fused_chunk", "--preset", "smoke",
                 "--out", str(tmp_path / "out")])
    assert code == 2
    assert "fla has none of the variants asked for of gla" in capsys.readouterr().err


@pytest.mark.parametrize("broken,verdict,why", [
    (False, "SKIP", "the release lacks what this case calls: fla 0.6.0 has no module fla.ops.kda"),
    (True, "ERROR", "fla.ops.kda does not import: ValueError: key contains names that are not kernel arguments"),
])
def test_an_op_a_release_lacks_or_cannot_import_is_a_row_per_case(stub_fla, tmp_path, broken, verdict, why):
    """kda before fla 0.4 has no module: every case a SKIP saying so; a module there that fails on
    import (fla 0.4.2 under triton 3.9) is the release's error: every case an ERROR with it.
    Either way the sweep runs on, as for any implementation."""
    if broken:
        kda = tmp_path / "fla" / "ops" / "kda"
        kda.mkdir(parents=True)
        (kda / "__init__.py").write_text("raise ValueError('key contains names that are not kernel arguments')\n")
    code, rows = sweep(tmp_path, "kda", "--variant", "chunk")
    assert code == (1 if broken else 0)
    assert set(rows["verdict"]) == {verdict} and len(rows) >= 1
    assert rows["message"].str.startswith(why).all(), rows["message"].iloc[0]


def test_a_function_a_release_lacks_is_a_skip_per_case(stub_fla, tmp_path, monkeypatch):
    """A release whose module has no function the op's declaration names (fla.ops.gla without
    chunk_gla) lacks that variant: every case a SKIP saying so."""
    monkeypatch.setattr(upstream, "targets", lambda name, op: {"chunk": "fla.ops.gla:chunk_gla_v2"})
    code, rows = sweep(tmp_path, "gla", "--variant", "chunk")
    assert code == 0 and set(rows["verdict"]) == {"SKIP"}
    assert rows["message"].str.endswith("fla 0.6.0's fla.ops.gla has no chunk_gla_v2").all(), rows["message"].iloc[0]


def test_missing_fla_is_one_line_before_any_kernel(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # import fla raises ImportError
    code = main(["sweep", "--op", "gla", "--impl", "fla", "--preset", "smoke",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "--impl fla: fla (flash-linear-attention; pip install fla-core) does not import here" in err
    assert not (tmp_path / "out").exists()


def test_every_fla_target_names_a_variant_of_ours():
    from harness.registry import OPS
    for op, spec in OPS.items():
        assert set(upstream.targets("fla", op)) <= set(spec.variants), op


def fitted_old(q, k, v, head_first=True):
    pass


def test_the_adapters_allocations_under_test_are_flas():
    """An adapter lives in the harness, but the allocations to poison are those of the package it
    calls; a function of any other package is its own."""
    from harness.allocations import package_of
    assert package_of(upstream.fla_chunk_linear_attn) == "fla"
    assert package_of(upstream.fitted(upstream.fla_chunk_linear_attn, ["q", "k", "v"])) == "fla"
    assert package_of(upstream.fitted(fitted_old, ["q", "k", "v"])) == "tests"
    assert package_of(torch.nn.functional.linear) is None
    from tests.implementations import baseline_like
    assert package_of(baseline_like) == "tests"


def _verdicts(rows) -> dict:
    """{(check, tensor): verdict} of a sweep's golden and run rows."""
    shown = rows[rows["check"].isin(["golden", "run"])]
    return dict(zip(zip(shown["check"], shown["tensor"].fillna("")), shown["verdict"]))


@pytest.mark.parametrize("release", ["RELEASE_0_1_0"], indirect=True)
def test_fla_0_1_chunk_rwkv6_takes_r_and_w_under_their_earlier_names(release, tmp_path):
    code, rows = sweep(tmp_path, "rwkv6", "--variant", "chunk")
    assert code == 0, rows[rows["verdict"] != "PASS"][["tensor", "message"]]


def test_renamed_inputs_keep_their_place_when_others_move():
    """An input under its earlier name (EARLIER_NAMES) after one the release takes elsewhere."""
    def release(q, k, v, extra=None, g=None, u=None, scale=None):
        return dict(q=q, k=k, v=v, extra=extra, g=g, u=u, scale=scale)
    got = upstream.fitted(release, ["r", "k", "v", "w", "u"])("R", "K", "V", "W", "U", scale=1)
    assert got == dict(q="R", k="K", v="V", extra=None, g="W", u="U", scale=1)


@pytest.mark.parametrize("release", ["RELEASE_0_2_2"], indirect=True)
def test_gsa_final_states_as_a_list_chain_and_compare(release, tmp_path):
    """fla's gsa returns [hkt, hvt] ([None, None] without them); segments chain through the list."""
    code, rows = sweep(tmp_path, "gsa", "--variant", "fused_recurrent", "--checks", "segments,options")
    assert code == 0, rows[rows["verdict"] != "PASS"][["tensor", "message"]]
    assert {"segments", "options"} <= set(rows["check"])


@pytest.mark.parametrize("release,op,args,why", [
    ("RELEASE_0_2_2", "simple_gla", ["--option", "g_gamma"], "does not take g_gamma"),
    ("RELEASE_0_3_2", "linear_attn", ["--varlen", "packed", "--h0", "none"],
     "fla 0.3.2's chunk_linear_attn takes no cu_seqlens"),
], indirect=["release"])
def test_what_a_release_does_not_take_is_a_skip(release, tmp_path, op, args, why):
    code, rows = sweep(tmp_path, op, "--variant", "chunk", *args)
    assert code == 0 and list(rows["verdict"]) == ["SKIP"] and why in rows["message"].iloc[0]


@pytest.mark.parametrize("release,o", [("RELEASE_0_3_2", "FAIL"), ("RELEASE_0_4_2", "PASS")], indirect=["release"])
def test_a_release_without_the_normaliser_state_shows_its_normalised_output(release, tmp_path, o):
    """Before fla 0.5 normalize=True keeps no z: o and ht are compared, zt is a SKIP, a case with
    z0 too; fla 0.3's normalisation over H fails o."""
    code, rows = sweep(tmp_path, "linear_attn", "--variant", "fused_recurrent", "--option", "normalize",
                       "--h0", "none,grad")
    assert _verdicts(rows) == {("golden", "o"): o, ("golden", "ht"): "PASS", ("run", "zt"): "SKIP",
                               ("run", ""): "SKIP"}
    assert code == (1 if o == "FAIL" else 0)
    assert "takes no normaliser state z0" in " ".join(rows["message"].dropna())


@pytest.mark.parametrize("release", ["RELEASE_0_5_2"], indirect=True)
def test_a_release_with_the_normaliser_state_takes_and_gives_the_pair(release, tmp_path):
    code, rows = sweep(tmp_path, "linear_attn", "--variant", "chunk", "--option", "normalize",
                       "--checks", "segments")
    assert code == 0, rows[rows["verdict"] != "PASS"][["tensor", "message"]]
    assert {"zt", "dz0"} <= set(rows.loc[rows["check"] == "segments", "tensor"])


@pytest.mark.parametrize("release", ["RELEASE_0_4_2"], indirect=True)
def test_a_release_that_fails_on_its_default_scale_is_not_helped(release):
    """fla 0.3-0.4's fused linear attention computes q * None with scale=None and normalize=True:
    the adapter passes scale as given (the harness gives K ** -0.5 itself)."""
    q = torch.rand(1, 4, 1, 8)
    with pytest.raises(TypeError):
        upstream.fla_fused_chunk_linear_attn(q, q, q, scale=None, normalize=True)


@pytest.mark.parametrize("release,verdict", [("RELEASE_0_1_0", "PASS"), ("RELEASE_0_4_2", "SKIP")],
                         indirect=["release"])
def test_fused_chunk_gla_where_a_release_has_it_and_where_it_only_raises(release, tmp_path, verdict):
    code, rows = sweep(tmp_path, "gla", "--variant", "fused_chunk")
    assert code == 0 and set(rows["verdict"]) == {verdict}


@pytest.mark.parametrize("release", ["RELEASE_0_1_0"], indirect=True)
def test_scale_none_is_the_default_where_a_release_means_it_by_another_value(release):
    from fla.ops.gla import fused_chunk_gla
    q, g = torch.rand(1, 4, 1, 8), -torch.rand(1, 4, 1, 8)
    fitted = upstream.fitted(fused_chunk_gla, ["q", "k", "v", "g"])
    assert torch.equal(fitted(q, q, q, g, scale=None)[0], fitted(q, q, q, g, scale=8 ** -0.5)[0])


@pytest.mark.parametrize("release", ["RELEASE_0_1_0", "RELEASE_0_4_2"], indirect=True)
def test_the_bench_calls_a_release_as_the_sweep_does(release):
    """`bench --impls fla` times fla's functions fitted to their release: 0.1's fused_chunk_gla
    in our layout (head_first=False), 0.4.2's stub as a SKIP row, not an ERROR."""
    import fla
    from harness.bench import candidates, measure
    from harness.cases import Case
    from harness.inputs import make_inputs
    from harness.registry import get_op
    spec = get_op("gla")
    case = Case("gla", "fp32", 1, 8, 2, 8, 8, "none", "normal", 0)
    inputs = make_inputs(spec, case, "cpu")
    (c,) = candidates(spec, ["fused_chunk"], ["fla"])
    rows = measure(c, spec, case, inputs)
    if fla.__version__ == "0.1":
        args = [x.detach() for x in inputs.tensors.values()]
        theirs, ours = c.fn(*args, scale=inputs.scale)[0], spec.variant_fn("fused_chunk")(*args, scale=inputs.scale)[0]
        assert torch.equal(theirs, ours) and all(r["message"] == "" for r in rows)
    else:
        assert [r["message"][:6] for r in rows] == ["SKIP: "]
