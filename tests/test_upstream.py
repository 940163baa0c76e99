"""`--impl fla`: upstream fla's variants in the place of ours, checked with a stand-in `fla` package
(fla itself needs a GPU driver to autotune), and the one-line error when fla is missing."""
import importlib
import sys
import textwrap

import pandas as pd
import pytest
import torch

from harness import upstream
from harness.cli import main

STUB = {
    "fla/__init__.py": "__version__ = '0.6.0'",
    "fla/ops/__init__.py": "",
    "fla/ops/gla/__init__.py": """
        from fla_kernels.ops.gla import chunk_gla, fused_recurrent_gla
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
    yield from _installed(OLD_RELEASES, tmp_path, monkeypatch)


@pytest.fixture()
def stub_fla(tmp_path, monkeypatch):
    yield from _installed(STUB, tmp_path, monkeypatch)


def _installed(files, tmp_path, monkeypatch):
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        del sys.modules[name]


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
    assert "fused_chunk" not in set(rows["variant"])  # fla's fused_chunk_gla only raises


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


def test_fitting_leaves_a_function_of_our_order_alone():
    def ours_order(q, k, v, g, beta, scale=None):
        pass
    assert upstream.fitted(ours_order, ["q", "k", "v", "g", "beta"]) is ours_order


def test_linear_attention_is_called_unnormalised(stub_fla, tmp_path):
    code, rows = sweep(tmp_path, "linear_attn", "--variant", "chunk")
    assert code == 0, rows[rows["verdict"] != "PASS"][["tensor", "message"]]
    assert set(rows["impl"]) == {"harness.upstream:fla_chunk_linear_attn [fla 0.6.0]"}
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "implementations under test: `harness.upstream:fla_chunk_linear_attn [fla 0.6.0]`" in summary


def test_asking_for_a_variant_fla_lacks_is_a_usage_error(stub_fla, tmp_path, capsys):
    code = main(["sweep", "--op", "gla", "--impl", "fla", "--variant", "fused_chunk", "--preset", "smoke",
                 "--out", str(tmp_path / "out")])
    assert code == 2
    assert "fla has none of the variants asked for of gla" in capsys.readouterr().err


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
    assert package_of(upstream.fitted(fitted_old, ["q", "k", "v"])) == "tests"
    assert package_of(torch.nn.functional.linear) is None
    from tests.implementations import baseline_like
    assert package_of(baseline_like) == "tests"
