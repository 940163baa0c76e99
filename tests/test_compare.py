"""Tests of reports.compare on small hand-built result frames: every status both ways, the
markdown comment, the HTML page, and two CSVs of the synthetic demo run read back from disk."""
import math
import re

import numpy as np
import pandas as pd
import pytest

from reports.schema import COLUMNS
from reports import BAD_STATUSES, KEY, compare_runs, read_results, render_compare_html, \
    render_compare_markdown, write_compare_html
from reports.compare import COMPARE_COLUMNS, STATUSES, compare_figure, fmt_growth
from reports.demo import synthetic_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def row(case="gla-1", tensor="o", ratio=0.1, verdict="PASS", **kw):
    """One golden row of gla/chunk with err/bound `ratio` (bound 1e-3), overridden by `kw`."""
    r = dict(run_id="r", case_id=case, op="gla", variant="chunk", impl="ours", dtype="bf16",
             B=1, T=64, H=2, K=16, V=16, M=np.nan, h0="none", gate="normal", seed=0,
             check="golden", tensor=tensor, err=ratio * 1e-3, bound=1e-3, ratio=ratio, nan=0,
             inf=0, first_bad="", verdict=verdict, message="", device="cpu")
    r.update(kw)
    return r


def frame(*rows):
    return pd.DataFrame(list(rows)).reindex(columns=COLUMNS)


def status_of(table, case="gla-1", tensor="o"):
    hit = table[(table["case_id"] == case) & (table["tensor"] == tensor)]
    assert len(hit) == 1, hit
    return hit.iloc[0]


@pytest.fixture()
def base_rows():
    return [row(tensor=t, ratio=r) for t, r in (("o", 0.1), ("ht", 0.2), ("dq", 0.3))]


def test_identical_runs_are_the_same_and_pass(base_rows):
    table = compare_runs(frame(*base_rows), frame(*base_rows))
    assert list(table.columns) == list(COMPARE_COLUMNS)
    assert set(table["status"]) == {"same"}
    assert (table["growth"] == 1.0).all()
    md = render_compare_markdown(table)
    first = md.splitlines()[0]
    assert "**PASS**" in first and "3 same" in first
    assert "| case |" not in md


def test_pass_to_fail_is_a_new_failure_listed_first(base_rows):
    cand = [*base_rows[:2], row(tensor="dq", ratio=4.0, verdict="FAIL", message="err > bound")]
    table = compare_runs(frame(*cand), frame(*base_rows))
    assert table.iloc[0]["status"] == "new failure"
    assert table.iloc[0]["tensor"] == "dq"
    assert table.iloc[0]["verdict_baseline"] == "PASS"
    assert table.iloc[0]["verdict_candidate"] == "FAIL"
    assert table.iloc[0]["message"] == "err > bound"
    md = render_compare_markdown(table)
    assert "**FAIL**" in md.splitlines()[0] and "1 new failure" in md.splitlines()[0]
    assert "| 0.3 | 4 FAIL | x13 | err &gt; bound |" in md


def test_growth_beyond_the_factor_grew_and_shows_as_x35():
    table = compare_runs(frame(row(ratio=0.35)), frame(row(ratio=0.1)), growth_factor=2.0)
    r = status_of(table)
    assert r["status"] == "grew" and r["growth"] == pytest.approx(3.5)
    assert "grew" in BAD_STATUSES
    md = render_compare_markdown(table)
    assert "**FAIL**" in md.splitlines()[0]
    assert "x3.5" in md and "**grew** (1)" in md
    assert status_of(compare_runs(frame(row(ratio=0.35)), frame(row(ratio=0.1)), 4.0))["status"] \
        == "same"


def test_growth_under_the_ratio_floor_is_the_same():
    r = status_of(compare_runs(frame(row(ratio=0.004)), frame(row(ratio=0.001))))
    assert r["status"] == "same" and r["growth"] == pytest.approx(4.0)
    assert status_of(compare_runs(frame(row(ratio=0.06)), frame(row(ratio=0.001))))["status"] \
        == "grew"


def test_growth_from_zero():
    r = status_of(compare_runs(frame(row(ratio=0.2)), frame(row(ratio=0.0))))
    assert r["status"] == "grew" and math.isinf(r["growth"])
    assert fmt_growth(r["growth"]) == "x∞"
    r = status_of(compare_runs(frame(row(ratio=0.01)), frame(row(ratio=0.0))))
    assert r["status"] == "same"
    assert status_of(compare_runs(frame(row(ratio=0.0)), frame(row(ratio=0.0))))["growth"] == 1.0


def test_shrank_both_ways_of_the_floor():
    assert status_of(compare_runs(frame(row(ratio=0.1)), frame(row(ratio=0.4))))["status"] == "shrank"
    assert status_of(compare_runs(frame(row(ratio=0.001)), frame(row(ratio=0.04))))["status"] == "same"


def test_missing_candidate_row_disappeared(base_rows):
    table = compare_runs(frame(*base_rows[:2]), frame(*base_rows))
    r = status_of(table, tensor="dq")
    assert r["status"] == "disappeared"
    assert r["verdict_candidate"] == "" and np.isnan(r["ratio_candidate"])
    assert r["message"] == "not in the candidate"
    assert table.iloc[0]["tensor"] == "dq"
    assert "**FAIL**" in render_compare_markdown(table).splitlines()[0]


def test_rows_of_an_errored_case_disappear_with_the_reason(base_rows):
    error = row(check="run", tensor="", ratio=np.nan, err=np.nan, bound=np.nan, verdict="ERROR",
                message="CompilationError: boom")
    table = compare_runs(frame(error), frame(*base_rows))
    assert status_of(table, tensor="")["status"] == "new failure"
    gone = table[table["status"] == "disappeared"]
    assert len(gone) == 3
    assert gone["message"].str.contains("ERROR: CompilationError: boom").all()


def test_skipped_in_the_candidate_disappeared():
    cand = frame(row(check="run", tensor="", verdict="SKIP", ratio=np.nan, message="no CUDA"))
    base = frame(row(check="run", tensor="", verdict="PASS", ratio=np.nan))
    assert status_of(compare_runs(cand, base), tensor="")["status"] == "disappeared"
    skip_both = compare_runs(base.assign(verdict="SKIP"), base.assign(verdict="SKIP"))
    assert set(skip_both["status"]) == {"same"}


def test_extra_candidate_row_is_new_and_not_bad(base_rows):
    cand = [*base_rows, row(case="gla-2", tensor="o", ratio=0.9)]
    table = compare_runs(frame(*cand), frame(*base_rows))
    r = status_of(table, case="gla-2")
    assert r["status"] == "new" and r["verdict_baseline"] == ""
    assert "new" not in BAD_STATUSES
    assert "**PASS**" in render_compare_markdown(table).splitlines()[0]


def test_fail_to_pass_is_fixed_and_fail_to_fail_still_failing():
    table = compare_runs(frame(row(tensor="o", ratio=0.5), row(tensor="ht", ratio=2.0, verdict="FAIL")),
                         frame(row(tensor="o", ratio=3.0, verdict="FAIL"),
                               row(tensor="ht", verdict="ERROR", ratio=np.nan)))
    assert status_of(table, tensor="o")["status"] == "fixed"
    assert status_of(table, tensor="ht")["status"] == "still failing"
    assert "fixed" not in BAD_STATUSES


def test_unknown_candidate_verdict_counts_as_failing():
    r = status_of(compare_runs(frame(row(verdict="MAYBE")), frame(row())))
    assert r["status"] == "new failure"


def test_a_fixed_crash_is_fixed_not_disappeared(base_rows):
    error = row(check="run", tensor="", ratio=np.nan, err=np.nan, bound=np.nan, verdict="ERROR",
                message="boom")
    table = compare_runs(frame(*base_rows), frame(error))
    assert status_of(table, tensor="")["status"] == "fixed"
    assert set(table[table["tensor"] != ""]["status"]) == {"new"}
    cand = [*base_rows[:2], row(tensor="dq", ratio=5.0, verdict="FAIL")]
    table = compare_runs(frame(*cand), frame(error))
    assert status_of(table, tensor="")["status"] == "still failing"
    assert status_of(table, tensor="dq")["status"] == "new failure"


def test_rows_match_on_variant_not_impl(base_rows):
    cand = [dict(r, impl="mypkg.kernels:chunk_gla") for r in base_rows]
    table = compare_runs(frame(*cand), frame(*base_rows))
    assert len(table) == 3 and set(table["status"]) == {"same"}
    assert set(table["impl_candidate"]) == {"mypkg.kernels:chunk_gla"}
    assert set(table["impl_baseline"]) == {"ours"}
    assert "impl" not in KEY
    other = [dict(r, variant="fused_recurrent") for r in base_rows]
    statuses = compare_runs(frame(*other), frame(*base_rows))["status"]
    assert sorted(statuses) == ["disappeared"] * 3 + ["new"] * 3


def test_rows_without_ratios_compare_by_verdict():
    def inputs(verdict, message=""):
        return row(check="inputs", tensor="", ratio=np.nan, err=np.nan, bound=np.nan,
                   verdict=verdict, message=message)
    same = compare_runs(frame(inputs("PASS")), frame(inputs("PASS")))
    assert status_of(same, tensor="")["status"] == "same"
    assert np.isnan(status_of(same, tensor="")["growth"])
    bad = compare_runs(frame(inputs("FAIL", "wrote into k")), frame(inputs("PASS")))
    assert status_of(bad, tensor="")["status"] == "new failure"
    assert status_of(compare_runs(frame(inputs("PASS")), frame(inputs("FAIL"))), tensor="")["status"] \
        == "fixed"


def test_order_statuses_then_growth():
    base = [row(tensor=t, ratio=0.1) for t in ("o", "ht", "dq", "dk", "dv")]
    cand = [row(tensor="o", ratio=0.1), row(tensor="ht", ratio=0.3), row(tensor="dq", ratio=0.9),
            row(tensor="dk", ratio=2.0, verdict="FAIL"), row(case="gla-2", ratio=0.1)]
    table = compare_runs(frame(*cand), frame(*base))
    assert list(zip(table["status"], table["tensor"])) == [
        ("new failure", "dk"), ("disappeared", "dv"), ("grew", "dq"), ("grew", "ht"),
        ("new", "o"), ("same", "o")]
    ranks = table["status"].map(STATUSES.index)
    assert ranks.is_monotonic_increasing


def test_duplicate_keys_keep_the_worst_row():
    cand = frame(row(ratio=0.1), row(ratio=3.0, verdict="FAIL"), row(ratio=0.2))
    table = compare_runs(cand, frame(row(ratio=0.1)))
    assert len(table) == 1 and status_of(table)["status"] == "new failure"


def test_ratio_filled_from_err_and_bound():
    cand = frame(row(ratio=np.nan, err=4e-4, bound=1e-3))
    r = status_of(compare_runs(cand, frame(row(ratio=0.1))))
    assert r["ratio_candidate"] == pytest.approx(0.4) and r["status"] == "grew"


def test_markdown_meta_truncation_and_escaping(base_rows):
    base = [row(case=f"gla-{i}", ratio=0.1) for i in range(7)]
    cand = [row(case=f"gla-{i}", ratio=2.0, verdict="FAIL", message="a | b <c>\nsecond line")
            for i in range(7)]
    md = render_compare_markdown(compare_runs(frame(*cand), frame(*base)),
                                 {"run": "pr-42", "ops": "gla (changed gla/chunk.py)"}, max_rows=3)
    lines = md.splitlines()
    assert lines[0].startswith("❌ **FAIL**") and "7 new failure" in lines[0]
    assert "- run: pr-42" in md and "- ops: gla (changed gla/chunk.py)" in md
    assert "- growth factor: 2" in md and "- ratio floor: 0.05" in md
    assert "… and 4 more new failure rows." in md
    assert "a \\| b &lt;c&gt; second line" in md
    assert sum(line.startswith("| `gla-") for line in lines) == 3


def test_markdown_lists_each_bad_status():
    cand = frame(row(tensor="o", ratio=0.9), row(tensor="ht", ratio=2.0, verdict="FAIL"),
                 row(tensor="dk", ratio=3.0, verdict="FAIL"))
    base = frame(row(tensor="o", ratio=0.1), row(tensor="ht", ratio=1.5, verdict="FAIL"),
                 row(tensor="dv", ratio=0.1), row(tensor="dk", ratio=0.1))
    md = render_compare_markdown(compare_runs(cand, base))
    order = [md.index(f"**{s}**") for s in ("new failure", "still failing", "disappeared", "grew")]
    assert order == sorted(order)
    assert "| — |" in md  # the disappeared row has no candidate side


def agreement_case(golden_a, golden_b, agreement, golden=True):
    """Rows of one case: ht's golden rows of chunk and fused_chunk at err/bound golden_a and
    golden_b (if `golden`), and their agreement row at `agreement`."""
    rows = [row(variant="chunk~fused_chunk", check="agreement", tensor="ht", ratio=agreement)]
    if golden:
        rows += [row(variant="chunk", tensor="ht", ratio=golden_a),
                 row(variant="fused_chunk", tensor="ht", ratio=golden_b)]
    return frame(*rows)


def test_agreement_that_grows_because_one_variant_improved_is_grew_apart_and_passes():
    """gla on the H200: chunk's ht went from 0.49 to 0.05 of its bound, fused_chunk's stayed at
    0.5, and their agreement from 1e-5 to 0.25 of its bound: no kernel got worse."""
    table = compare_runs(agreement_case(0.05, 0.5, 0.25), agreement_case(0.49, 0.5, 1e-5))
    r = table[table["check"] == "agreement"].iloc[0]
    assert r["status"] == "grew apart" and "grew apart" not in BAD_STATUSES
    assert dict(zip(table["variant"], table["status"]))["chunk"] == "shrank"
    md = render_compare_markdown(table)
    assert "**PASS**" in md.splitlines()[0] and "1 grew apart" in md.splitlines()[0]


def test_agreement_growing_past_its_variants_golden_ratios_or_without_them_still_grew():
    """Two variants that agreed closely and each were near the golden now differ by more than
    the growth factor of their golden ratios allows: grew (their golden rows grew too). With no
    golden rows to weigh it against (a sampled case's parameters), the agreement row alone grew."""
    table = compare_runs(agreement_case(0.3, 0.3, 0.3), agreement_case(0.02, 0.01, 1e-4))
    assert set(table["status"]) == {"grew"}
    alone = compare_runs(agreement_case(0, 0, 0.25, golden=False), agreement_case(0, 0, 1e-5, golden=False))
    assert alone.iloc[0]["status"] == "grew"
    assert "**FAIL**" in render_compare_markdown(alone).splitlines()[0]


def test_markdown_counts_the_rows_the_baseline_lacks_per_op_and_check(base_rows):
    """A check added after the baseline was written gives rows no growth is gated on: the comment
    says how many, per op and check, and the verdict stays PASS; without such rows, no such line."""
    cand = [*base_rows, row(check="inference", tensor="o"), row(check="inference", tensor="ht"),
            row(op="kda", case="kda-1", check="golden", tensor="o")]
    md = render_compare_markdown(compare_runs(frame(*cand), frame(*base_rows)))
    assert "**PASS**" in md.splitlines()[0] and "3 new" in md.splitlines()[0]
    assert "**new** (3): not in the baseline" in md
    assert "(gla inference 2, kda golden 1)" in md
    assert "**new**" not in render_compare_markdown(compare_runs(frame(*base_rows), frame(*base_rows)))


def _no_external_refs(page: str):
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page)


def test_html_renders_plot_and_table(tmp_path, base_rows):
    cand = [row(tensor="o", ratio=0.35), row(tensor="ht", ratio=3.0, verdict="FAIL",
                                             message="<script>x</script>"),
            row(tensor="dq", ratio=0.3, op="rwkv6")]
    table = compare_runs(frame(*cand), frame(*base_rows))
    page = render_compare_html(table, {"candidate": "run <b>1</b>"})
    assert "<title>candidate vs baseline: FAIL</title>" in page
    assert '<img class="plot"' in page and "data:image/png;base64," in page
    assert '<table id="results" class="sortable' in page and 'id="filter-text"' in page
    assert 'class="s-new-failure">new failure</td>' in page
    assert '<td class="r-bad">3</td>' in page and '<td class="r-bad">x3.5</td>' in page
    assert "<script>x</script>" not in page and "run &lt;b&gt;1&lt;/b&gt;" in page
    positions = [page.index(f">{s}</td>") for s in ("new failure", "disappeared", "grew", "new")]
    assert positions == sorted(positions)
    _no_external_refs(page)
    path = write_compare_html(table, tmp_path / "compare.html")
    assert open(path, encoding="utf-8").read().startswith("<!DOCTYPE html>")
    png = compare_figure(table, 2.0, 0.05)
    assert png.startswith(PNG_MAGIC)


def test_html_and_markdown_of_empty_and_ratio_free_tables():
    empty = compare_runs(frame(), frame())
    assert empty.empty and list(empty.columns) == list(COMPARE_COLUMNS)
    assert "**PASS**" in render_compare_markdown(empty).splitlines()[0]
    page = render_compare_html(empty)
    assert "<img" not in page and "No rows in either run." in page
    _no_external_refs(page)
    inputs = row(check="inputs", tensor="", ratio=np.nan, err=np.nan, bound=np.nan)
    table = compare_runs(frame(inputs), frame(inputs))
    page = render_compare_html(table)
    assert "<img" not in page and "nothing to plot" in page and 'id="results"' in page
    assert compare_figure(table) is None


def test_demo_csvs_round_trip(tmp_path):
    base_path, cand_path = tmp_path / "base.csv", tmp_path / "cand.csv"
    synthetic_results(seed=0, planted=False).to_csv(base_path, index=False)
    synthetic_results(seed=0, planted=True).to_csv(cand_path, index=False)
    table = compare_runs(read_results(cand_path), read_results(base_path))
    assert len(table) >= len(read_results(base_path))
    first = table.iloc[0]
    assert first["status"] == "new failure"
    nan_fail = table[(table["case_id"] == "gla-bf16-T4096-strong") & (table["variant"] == "fused_chunk")
                     & (table["tensor"] == "o")].iloc[0]
    assert nan_fail["status"] == "new failure" and math.isinf(nan_fail["ratio_candidate"])
    error = table[(table["check"] == "run") & (table["verdict_candidate"] == "ERROR")]
    assert set(error["status"]) == {"new failure"}
    assert set(table["status"]) <= set(STATUSES)
    assert "**FAIL**" in render_compare_markdown(table).splitlines()[0]
    same = compare_runs(read_results(base_path), read_results(base_path))
    assert set(same["status"]) == {"same"}
    page = render_compare_html(table)
    assert '<img class="plot"' in page
    _no_external_refs(page)


def test_new_failures_rank_by_how_far_over_the_bound_not_by_growth():
    """An agreement row from 0 to 1.1 (growth inf) must not bury a golden row at 5x its bound."""
    base = [row(tensor="dw", ratio=0.2), row(tensor="dw", ratio=0.0, check="agreement",
                                             variant="chunk~fused_recurrent")]
    cand = [row(tensor="dw", ratio=5.0, verdict="FAIL"),
            row(tensor="dw", ratio=1.1, verdict="FAIL", check="agreement",
                variant="chunk~fused_recurrent")]
    table = compare_runs(frame(*cand), frame(*base))
    assert list(table["status"]) == ["new failure", "new failure"]
    assert list(table["check"]) == ["golden", "agreement"]


def test_html_names_one_implementation_per_variant_once_and_shows_verdicts_without_ratios(base_rows):
    inputs = dict(check="inputs", tensor="", ratio=np.nan, err=np.nan, bound=np.nan)
    cand = [dict(r, impl="mypkg:chunk_gla") for r in base_rows]
    cand.append(row(**inputs, verdict="FAIL", message="wrote into k", impl="mypkg:chunk_gla"))
    page = render_compare_html(compare_runs(frame(*cand), frame(*base_rows, row(**inputs))))
    heads = re.findall(r'<th data-col="([^"]+)"', page)
    assert not {"op", "impl_baseline", "impl_candidate"} & set(heads)
    assert "impl_baseline: ours, impl_candidate: mypkg:chunk_gla" in page
    assert '<td class="r-bad">FAIL</td>' in page and '<td class="r-na">PASS</td>' in page
    assert not re.search(r"<td[^>]*>nan</td>", page)
    assert 'class="more-cols" data-table="results"' in page  # verdicts, err and bound on asking


def test_a_sum_drawn_afresh_within_its_chance_spreads_is_the_same_and_past_them_grew():
    """The h100 suite on an H200, delta_rule fp16, dbeta summed over 16,384 elements: err/bound
    0.004 in the baseline (a draw near 0), 0.69 from a correct kernel that rounds in another
    order. Within 4 of its spreads (the root sum of squares of its deviations), that is chance:
    the same. The same err with deviations ten times smaller, so that it leans one way: grew.
    The other way round, a draw nearer 0 is not "shrank" either."""
    t = "dbeta (sum over b, t, h)"
    sums = dict(check="aggregate", tensor=t, bound=0.4268, floor=0.0242, atol=1e-5)
    base = row(**sums, ratio=0.00417, err=0.00178)
    drawn = row(**sums, ratio=0.688, err=0.2935, spread=0.08)
    leaning = row(**sums, ratio=0.688, err=0.2935, spread=0.008)

    def status(candidate, baseline):
        table = compare_runs(frame(candidate), frame(baseline), noise_roundings=4)
        return status_of(table, tensor=t)["status"]
    assert status(drawn, base) == "same"
    assert status(leaning, base) == "grew"
    assert status(base, drawn) == "same"
