"""The metrics and the tolerance policy, each tested on right and on wrong tensors."""
import dataclasses
import math

import pytest
import torch

from harness import tolerance
from harness.registry import OPS
from harness.metrics import FEW_ELEMENTS, compare_to_golden, compare_variants, first_bad_index, half_ulp
from reports.schema import CHANCE_SIGMAS
from harness.tolerance import Tolerance, tolerance_for

TOL = Tolerance(factor=2.0, atol=1e-6)
CHUNK = 64   # the baseline chunk these tests' sums are measured in (`compare_sums`' block)


def tensors(seed=0, shape=(2, 30, 3, 8)):
    g = torch.Generator().manual_seed(seed)
    gold = torch.randn(shape, generator=g, dtype=torch.float64)
    base = (gold + 1e-3 * torch.randn(shape, generator=g, dtype=torch.float64)).float()
    return gold, base


def test_exact_result_passes_with_zero_error():
    gold, base = tensors()
    row = compare_to_golden(gold.float(), gold, base, TOL, seq_layout=True)
    assert row["verdict"] == "PASS"
    assert row["err"] <= row["floor"] and row["ratio"] < 0.5


def test_error_of_the_baseline_size_passes():
    gold, base = tensors()
    row = compare_to_golden(base, gold, base, TOL, seq_layout=True)
    assert row["verdict"] == "PASS"
    assert row["err"] == pytest.approx(row["base_err"])


def test_error_beyond_the_bound_fails_naming_every_term():
    gold, base = tensors()
    x = base.clone()
    x[1, 7, 2, 3] += 0.1
    row = compare_to_golden(x, gold, base, TOL, seq_layout=True)
    assert row["verdict"] == "FAIL"
    assert row["ratio"] > 1
    for term in ("bound", "baseline err", "floor", "atol"):
        assert term in row["message"]


def test_a_baseline_of_several_draws_takes_the_largest_error_and_still_fails_what_passes_them_all():
    """A one-element parameter gradient (a per-head decay's, a sum over every token): the baseline's
    draw in chunks of 64 landed 0.019 from the golden and through the segments 0.519 (bf16,
    T = 43884, on the GPU; 0.48 in chunks of 32); a kernel 2 bf16 steps off failed the first
    draw's bound alone and passes the two draws', while an error well past their spread still
    fails."""
    gold = torch.tensor([110.4808], dtype=torch.float64)
    lucky, typical = (torch.tensor([v], dtype=torch.bfloat16) for v in (110.5, 111.0))
    kernel = torch.tensor([111.5], dtype=torch.bfloat16)
    tol = Tolerance(factor=3.0, atol=1e-5)
    alone = compare_to_golden(kernel, gold, lucky, tol, seq_layout=False)
    assert alone["verdict"] == "FAIL" and alone["base_err"] == pytest.approx(4 * 0.0192, abs=4e-4)
    both = compare_to_golden(kernel, gold, [lucky, typical], tol, seq_layout=False)
    spread = math.sqrt((0.0192 ** 2 + 0.5192 ** 2) / 2)
    assert both["verdict"] == "PASS" and both["base_err"] == pytest.approx(4 * spread, abs=4e-4)
    far = compare_to_golden(torch.tensor([117.0], dtype=torch.bfloat16), gold, [lucky, typical], tol,
                            seq_layout=False)
    assert far["verdict"] == "FAIL" and "baseline err 1.47" in far["message"]


def test_a_few_elements_take_their_draws_spread_where_a_large_tensor_keeps_its_largest_error():
    """The largest of a few draws of a few elements is a noisy measure of the baseline's rounding:
    elements all drawn near the golden gave a correct kernel 0.96 of its bound (kda, fp32 layer,
    dA_log [H = 2], one seed in 24). Below FEW_ELEMENTS elements the baseline's error is at least
    CHANCE_SIGMAS root mean squares of its draws' errors; a tensor of more keeps the largest."""
    gold = torch.zeros(2, dtype=torch.float64)
    draws = [torch.tensor([1e-3, -2e-3]), torch.tensor([4e-3, 0.0]), torch.tensor([0.0, 2e-3])]
    rms = math.sqrt(sum(v * v for v in (1e-3, 2e-3, 4e-3, 2e-3)) / 6)
    kernel = torch.tensor([0.0, 0.013])
    tol = Tolerance(factor=3.0, atol=0.0, floor_factor=0.0)
    small = compare_to_golden(kernel, gold, draws, tol, seq_layout=False)
    assert small["base_err"] == pytest.approx(CHANCE_SIGMAS * rms) and small["verdict"] == "PASS"
    wrong = compare_to_golden(torch.tensor([0.0, 0.04]), gold, draws, tol, seq_layout=False)
    assert wrong["verdict"] == "FAIL" and wrong["first_bad"] == "(1,)"
    wide = FEW_ELEMENTS // 2
    large = compare_to_golden(kernel.repeat(wide), gold.repeat(wide), [d.repeat(wide) for d in draws], tol,
                              seq_layout=False)
    assert large["base_err"] == pytest.approx(4e-3) and large["verdict"] == "FAIL"


def test_nan_fails_and_names_the_earliest_step():
    gold, base = tensors()
    x = base.clone()
    x[1, 5, 2, 0] = float("nan")
    x[0, 9, 1, 1] = float("inf")
    row = compare_to_golden(x, gold, base, TOL, seq_layout=True)
    assert row["verdict"] == "FAIL"
    assert (row["nan"], row["inf"]) == (1, 1)
    assert row["first_bad"] == "(b=1, t=5, h=2)"
    assert "NaN" in row["message"] and math.isinf(row["err"])


def test_missing_tensor_fails():
    gold, base = tensors()
    row = compare_to_golden(None, gold, base, TOL, seq_layout=True)
    assert row["verdict"] == "FAIL" and "None" in row["message"]


def test_wrong_shape_fails():
    gold, base = tensors()
    row = compare_to_golden(base[:, :-1], gold, base, TOL, seq_layout=True)
    assert row["verdict"] == "FAIL" and "shape" in row["message"]


def test_zero_golden_passes_within_atol_only():
    gold = torch.zeros(2, 3, dtype=torch.float64)
    base = torch.zeros(2, 3)
    assert compare_to_golden(torch.full((2, 3), 1e-7), gold, base, TOL, False)["verdict"] == "PASS"
    assert compare_to_golden(torch.full((2, 3), 1e-5), gold, base, TOL, False)["verdict"] == "FAIL"


def test_non_finite_baseline_is_a_harness_error_not_a_pass():
    gold, base = tensors()
    base[0, 0, 0, 0] = float("inf")
    row = compare_to_golden(gold.float(), gold, base, TOL, seq_layout=True)
    assert row["verdict"] == "ERROR"


def test_floor_is_the_rounding_into_the_tensor_dtype():
    gold, base = tensors()
    row16 = compare_to_golden(gold.bfloat16(), gold, base.bfloat16(), TOL, seq_layout=True)
    row32 = compare_to_golden(gold.float(), gold, base, TOL, seq_layout=True)
    assert row16["floor"] > 100 * row32["floor"]
    assert row16["verdict"] == "PASS"


def test_floor_is_at_least_one_rounding_of_the_largest_value():
    """Two elements whose golden sits near bf16 values (their own rounding is tiny): a result one
    bf16 step away, as one fp32 result just past a rounding midpoint gives, passes; two steps fail."""
    gold = torch.tensor([-2.5298860790665536, -0.37377951901362144], dtype=torch.float64)
    base = gold.bfloat16()
    assert (base.double() - gold).abs().max() < 2e-3
    step = 2.0 ** -6   # bf16 spacing in [2, 4)
    assert half_ulp(2.53, torch.bfloat16) == step / 2 and half_ulp(0.0, torch.bfloat16) == 0.0
    one_step = compare_to_golden(torch.tensor([-2.546875, -0.373046875]).bfloat16(), gold, base, TOL, seq_layout=False)
    assert one_step["floor"] == step / 2 and one_step["verdict"] == "PASS", one_step
    two_steps = compare_to_golden(torch.tensor([-2.5625, -0.373046875]).bfloat16(), gold, base, TOL,
                                  seq_layout=False)
    assert two_steps["verdict"] == "FAIL", two_steps


def test_first_bad_index_without_sequence_layout():
    bad = torch.zeros(3, 4, dtype=torch.bool)
    bad[2, 1] = True
    assert first_bad_index(bad, seq_layout=False) == "(2, 1)"
    assert first_bad_index(torch.zeros(3, dtype=torch.bool), seq_layout=False) == ""


def test_variant_agreement_both_ways():
    gold, base = tensors()
    assert compare_variants(base, gold.float(), gold, 1e-2, True)["verdict"] == "PASS"
    far = base + 1.0
    row = compare_variants(far, gold.float(), gold, 1e-2, True)
    assert row["verdict"] == "FAIL" and "differ" in row["message"]
    nan = base.clone()
    nan[0, 3, 0, 0] = float("nan")
    assert compare_variants(nan, gold.float(), gold, 1e-2, True)["first_bad"] == "(b=0, t=3, h=0)"


def test_default_factors_and_overrides(monkeypatch):
    assert tolerance_for("rwkv6", "o", "bf16").factor == 2.0
    assert tolerance_for("rwkv6", "ht", "fp32").factor == 2.0
    assert tolerance_for("rwkv6", "dw", "bf16").factor == 3.0
    monkeypatch.setitem(OPS, "rwkv6", dataclasses.replace(OPS["rwkv6"], tolerances={("dw", "bf16"): {"factor": 5.0}}))
    monkeypatch.setattr(tolerance, "OVERRIDES", {("*", "dw", "bf16"): {"factor": 4.0, "atol": 1e-3}})
    tol = tolerance_for("rwkv6", "dw", "bf16")
    assert (tol.factor, tol.atol) == (5.0, 1e-3)
    assert tolerance_for("gla", "dw", "bf16").factor == 4.0
    assert tolerance_for("rwkv6", "dw", "fp16").factor == 3.0
    assert tol.bound(1.0, 0.5) == pytest.approx(5.0 + 1.0 + 1e-3)


def test_tensor_in_the_wrong_dtype_fails_and_floor_uses_the_contract():
    gold, base = tensors()
    row = compare_to_golden(gold.bfloat16(), gold, base, TOL, seq_layout=True, expected_dtype=torch.float32)
    assert row["verdict"] == "FAIL" and "bfloat16" in row["message"] and "float32" in row["message"]
    assert row["floor"] < 1e-6


def test_fp32_floor_allowance_grows_with_the_square_root_of_T_only():
    assert tolerance_for("gla", "o", "fp32", T=64).floor_factor == 16.0
    assert tolerance_for("gla", "o", "fp32", T=64 * 100).floor_factor == pytest.approx(160.0)
    assert tolerance_for("gla", "o", "bf16", T=64 * 100).floor_factor == 2.0


def test_float32_state_of_a_bf16_case_takes_the_fp32_floor_rule():
    state = tolerance_for("linear_attn", "ht", "bf16", T=64 * 16, tensor_dtype="fp32")
    assert state.floor_factor == pytest.approx(64.0)
    assert tolerance_for("linear_attn", "o", "bf16", T=64 * 16, tensor_dtype="bf16").floor_factor == 2.0


def _sums(x, gold, base):
    from harness.metrics import compare_sums
    tol = Tolerance(factor=3.0, atol=0.0, floor_factor=2.0)
    return dict(compare_sums(x, gold, base, tol, torch.float64, across_heads=True, block=CHUNK))


def test_sum_across_heads_takes_the_groups_errors_when_the_baselines_cancel():
    # sixteen (b, h) groups; the baseline is off by +e and -e in turn in its sums over tokens, so
    # its total is exact by luck. A kernel off by e / 2 in each group, one sign, passes the
    # total's bound (3 x sqrt(16) e); a kernel off by 2 e in each, one sign, fails it.
    gold = torch.zeros(2, 8, 8, 1, dtype=torch.float64)
    base = gold.clone()
    for g in range(16):
        base[g // 8, 0, g % 8, 0] = (-1) ** g * 1e-3
    rows = _sums(gold + 0.5e-3 / 8, gold, base)
    assert rows["t"]["verdict"] == "PASS"
    assert rows["b, t, h"]["verdict"] == "PASS"
    assert rows["b, t, h"]["base_err"] == pytest.approx(4e-3)
    rows = _sums(gold + 2e-3 / 8, gold, base)
    assert rows["b, t, h"]["verdict"] == "FAIL"
    assert "the sum over b, t, h" in rows["b, t, h"]["message"]


def test_a_sum_over_few_chunks_takes_the_spread_of_the_baselines_draws():
    """dg of a scalar gate, one chunk of 64 tokens, B = 2, H = 1: each sum over t is one draw of
    the baseline's error (its tokens share a chunk's state), so one lucky baseline leaves a
    correct kernel no room (our fused_recurrent gated_delta_rule, fp32, on the H200: 1.78 x). With
    the baseline drawn again (harness/redraws.py), the sums' baseline error is at least
    CHANCE_SIGMAS root mean squares of every draw's chunk sums: a kernel twice as far off as the
    typical draw passes, one twenty times as far fails. From one lucky draw alone the same kernel
    fails: a single draw cannot tell it from a biased one."""
    gold = torch.zeros(2, 64, 1, dtype=torch.float64)

    def drawn(*sums):
        base = gold.clone()
        base[:, 0, 0] = torch.tensor(sums, dtype=torch.float64)
        return base

    lucky = drawn(1e-4, -1e-4)
    draws = [lucky, drawn(1e-3, -1e-3), drawn(-1e-3, 1e-3), drawn(1e-3, 1e-3)]
    rms = math.sqrt((2 * 1e-4 ** 2 + 6 * 1e-3 ** 2) / 8)
    tol = Tolerance(factor=3.0, atol=0.0, floor_factor=2.0)

    def sum_row(x, draws):
        from harness.metrics import compare_sums
        return dict(compare_sums(x, gold, draws, tol, torch.float64, across_heads=True, block=CHUNK))

    kernel = gold + 2e-3 / 64
    rows = sum_row(kernel, draws)
    assert rows["t"]["base_err"] == pytest.approx(CHANCE_SIGMAS * rms), rows["t"]
    assert rows["b, t, h"]["base_err"] == pytest.approx(CHANCE_SIGMAS * rms * math.sqrt(2)), rows["b, t, h"]
    assert rows["t"]["verdict"] == rows["b, t, h"]["verdict"] == "PASS", rows
    far = sum_row(gold + 2e-2 / 64, draws)
    assert far["t"]["verdict"] == "FAIL" and far["t"]["message"].startswith("the sum over t"), far["t"]
    assert sum_row(kernel, [lucky])["t"]["verdict"] == "FAIL"


def _rounded_sums(x, gold, base):
    from harness.metrics import compare_sums
    tol = Tolerance(factor=3.0, atol=0.0, floor_factor=2.0)
    return dict(compare_sums(x, gold, base, tol, torch.bfloat16, across_heads=False, block=CHUNK))


def test_sums_allow_fresh_roundings_of_no_sign_and_fail_those_of_one_sign():
    """A golden whose rounding to bf16 sums to nothing (pairs a, -a) and a baseline that rounds as
    it does: the baseline's error of the sum is what its chunks' roundings add up to by chance. A
    kernel whose elements round one bf16 unit the other way, at 400 tokens of random signs, is
    chance (its sum leans under 4 x the root sum of squares of its deviations) and passes; the
    same 400 deviations of one sign fail, and say how far they lean."""
    gen = torch.Generator().manual_seed(0)
    half = torch.randn(1, 2048, 1, 1, generator=gen, dtype=torch.float64)
    gold = torch.cat([half, -half], dim=1)
    rounded = gold.to(torch.bfloat16).to(torch.float64)
    ulp = torch.zeros_like(gold)
    picked = torch.randperm(4096, generator=gen)[:400]
    ulp[0, picked] = rounded[0, picked].abs() * 2.0 ** -7
    signs = torch.randint(0, 2, gold.shape, generator=gen).to(torch.float64) * 2 - 1
    assert (rounded - gold).sum().abs() < 1e-12
    noise = _rounded_sums(rounded + ulp * signs, gold, rounded)["t"]
    assert noise["verdict"] == "PASS" and noise["err"] > 0 and noise["bound"] >= noise["err"], noise
    bias = _rounded_sums(rounded + ulp, gold, rounded)["t"]
    assert bias["verdict"] == "FAIL", bias
    lean = (ulp.sum() / ulp.pow(2).sum().sqrt()).item()
    assert f"lean one way, {lean:.3g} x their root sum of squares (chance: up to 4)" in bias["message"], bias


def test_a_sums_spread_is_the_root_sum_of_squares_of_its_deviations_from_the_rounded_golden():
    """The room the gate gives a sum drawn afresh (reports/compare.py): per sum, the root sum of
    squares of the kernel's deviations from the golden rounded to its dtype; the largest of them."""
    from harness.metrics import compare_sums
    gen = torch.Generator().manual_seed(0)
    gold = torch.randn(2, 64, 2, 4, generator=gen, dtype=torch.float64)
    rounded = gold.to(torch.bfloat16).to(torch.float64)
    deviation = torch.randn(gold.shape, generator=gen, dtype=torch.float64) * 1e-3
    tol = Tolerance(factor=3.0, atol=0.0, floor_factor=2.0)
    rows = dict(compare_sums(rounded + deviation, gold, rounded, tol, torch.bfloat16, True, CHUNK))
    assert rows["t"]["spread"] == pytest.approx(deviation.pow(2).sum(1).sqrt().max().item())
    assert rows["b, t, h"]["spread"] == pytest.approx(deviation.pow(2).sum((0, 1, 2)).sqrt().max().item())
    assert dict(compare_sums(rounded, gold, rounded, tol, torch.bfloat16, True, CHUNK))["t"]["spread"] == 0.0


def test_a_long_sums_baseline_error_is_at_least_what_its_chunks_add_up_to():
    """One sum over 4,096 tokens, float64 (no rounding floor). The baseline's token errors cancel
    in pairs 2,048 tokens apart, so its sum is exact by luck, while each 64-token chunk of it is
    off: its error is the root sum of squares of those chunks' sums. A kernel off as much, signs at
    random, passes within three of them; four times as far off it fails without leaning; off as
    much in one direction it fails as leaning. Over fewer than two chunks the sum is one chunk
    sum: a draw of one, of which the baseline's error is CHANCE_SIGMAS times."""
    from harness.metrics import compare_sums
    gen = torch.Generator().manual_seed(1)
    gold = torch.randn(1, 4096, 1, generator=gen, dtype=torch.float64)
    scale = torch.rand(1, 2048, 1, generator=gen, dtype=torch.float64) * 1e-3
    paired = torch.randint(0, 2, scale.shape, generator=gen).to(torch.float64) * 2 - 1
    base = gold + torch.cat([scale * paired, -scale * paired], dim=1)
    deviation = torch.cat([scale, scale], dim=1) * (torch.randint(0, 2, gold.shape, generator=gen) * 2 - 1)
    chunks = (base - gold).reshape(1, 4096 // CHUNK, CHUNK, 1).sum(2)
    spread = chunks.pow(2).sum().sqrt().item()
    lean = (deviation.sum().abs() / deviation.pow(2).sum().sqrt()).item()
    assert abs((base - gold).sum().item()) < 1e-12 and 1.0 < lean < 4.0, lean
    tol = Tolerance(factor=3.0, atol=0.0, floor_factor=2.0)

    def sum_row(x, base=base, gold=gold):
        return dict(compare_sums(x, gold, base, tol, torch.float64, across_heads=False, block=CHUNK))["t"]

    like_base = sum_row(gold + deviation)
    assert like_base["base_err"] == pytest.approx(spread)
    assert like_base["verdict"] == "PASS" and like_base["err"] > spread, like_base
    noisier = sum_row(gold + 4 * deviation)
    assert noisier["verdict"] == "FAIL" and "lean one way" not in noisier["message"], noisier
    one_sign = sum_row(gold + deviation.abs())
    assert one_sign["verdict"] == "FAIL" and "lean one way" in one_sign["message"], one_sign
    short = sum_row(gold[:, :127] + deviation[:, :127], base[:, :127], gold[:, :127])
    assert short["base_err"] == pytest.approx(CHANCE_SIGMAS * abs((base - gold)[:, :127].sum().item()))
