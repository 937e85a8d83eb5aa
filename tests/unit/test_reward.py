from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2.data import ground_truth, load_rows
from rstar2.reward import RewardScorer, equivalent, extract_answer, normalize, samples

# a bounded verification: the session scorer's 3 s timeout, then a replacement worker's start,
# with room for a loaded machine (unbounded, these take minutes or never end)
BOUNDED_S = 8.0


def wrap(answer: str) -> str:
    return samples.response(answer)


# ---- extraction (pure) ----


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{3} and later \\boxed{5}", "5"),
        ("<answer>\\boxed{7}</answer> then \\boxed{9}", "7"),
        ("<answer>a</answer> <answer>\\boxed{1}</answer> <answer>\\boxed{2}</answer>", "2"),
        ("<answer>no box</answer> but \\boxed{4} earlier", "4"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\fbox{12}", "12"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed 5$", "5"),
        ("\\boxed{4} then a cut-off \\boxed{\\frac{1}{", "4"),
        ("no answer here", None),
        ("<answer>42</answer>", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@given(st.text(alphabet=st.sampled_from("\\boxed{}<>/answerfx 1"), max_size=300))
@settings(max_examples=300, deadline=None)
def test_extract_never_raises(text):
    out = extract_answer(text)
    assert out is None or isinstance(out, str)


# ---- normalisation (pure) ----


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("007", "7"),
        ("1,000", "1000"),
        ("1{,}000", "1000"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac{3}{4}", "3/4"),
        ("\\tfrac34", "0.75"),
        ("-\\frac{1}{2}", "\\frac{-1}{2}"),
        ("30^\\circ", "30"),
        ("30^{\\circ}", "30°"),
        ("50\\%", "50"),
        ("10\\text{ cm}", "10"),
        ("x = 5", "5"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("2π", "2\\pi"),
        ("\\left( 1, 2 \\right]", "(1,2]"),
        ("3, 1, 2", "1,2,3"),
        ("\\{2, 1\\}", "1, 2"),
        ("$5$", "5"),
        ("\\text{Evelyn}", "Evelyn"),
    ],
)
def test_normalising_check_equivalences(a, b):
    assert equivalent(a, b) and equivalent(b, a)


@pytest.mark.parametrize(("a", "b"), [("7", "8"), ("1,2", "1,3"), ("(1,2)", "[1,2]"), ("", "1")])
def test_normalising_check_rejects(a, b):
    assert not equivalent(a, b)


def test_normalize_refuses_giant_numbers():
    assert normalize("1" * 10000) == "1" * 10000
    assert not equivalent("1e99999999", "1")


# ---- scoring through the worker pool (math-verify) ----

EQUIVALENT = [
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("1.5", "\\frac{3}{2}"),
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("[1, 2)", "[1,2)"),
    ("2, 1", "1, 2"),
    ("\\pi", "π"),
    ("\\frac{\\pi}{2}", "\\pi/2"),
    ("1,234,567", "1234567"),
    ("0012", "12"),
    ("45^\\circ", "45"),
    ("25\\%", "25"),
    ("5 \\text{ meters}", "5"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("x^2+2x+1", "(x+1)^2"),
]

HMMT_VARIANTS = {
    "\\frac{1}{576}": ["1/576", "\\dfrac{1}{576}"],
    "\\frac{9 \\sqrt{23}}{23}": ["\\frac{9}{\\sqrt{23}}"],
    "1-\\frac{2}{\\pi}": ["\\frac{\\pi-2}{\\pi}"],
    "\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}": [
        "\\frac{-1-\\sqrt{17}}{2}, \\frac{-1+\\sqrt{17}}{2}"
    ],
    "2^{25} \\cdot 26!": ["26! \\cdot 2^{25}", "2^{25}\\times 26!"],
    "8\\sqrt{10}": ["\\sqrt{640}"],
    "\\sqrt{23}-2 \\sqrt{3}": ["-2\\sqrt{3}+\\sqrt{23}"],
    "14+4\\sqrt{37}": ["4\\sqrt{37}+14"],
    "\\sqrt{\\frac{95}{24}}": ["\\frac{\\sqrt{570}}{12}"],
    "9\\sqrt{15}": ["\\sqrt{1215}"],
    "-984": ["−984"],
}


@pytest.mark.parametrize(("pred", "truth"), EQUIVALENT)
def test_equivalent_spellings_score_1(scorer, pred, truth):
    assert scorer.score(wrap(pred), truth) == 1.0


@pytest.mark.parametrize(
    ("pred", "truth"),
    [("3", "4"), ("\\frac{1}{3}", "0.33"), ("\\sqrt{2}", "2"), ("1, 2", "1, 2, 3")],
)
def test_different_answers_score_0(scorer, pred, truth):
    assert scorer.score(wrap(pred), truth) == 0.0


def test_hmmt25_answers_grade_against_themselves_and_equivalents(scorer):
    truths = [ground_truth(r) for r in load_rows("hmmt25").rows]
    assert scorer.score_batch([wrap(t) for t in truths], truths) == [1.0] * len(truths)
    assert scorer.score_batch([wrap(samples.wrong(t)) for t in truths], truths) == [0.0] * 30
    checked = 0
    for truth in truths:
        for variant in HMMT_VARIANTS.get(truth, []):
            assert scorer.score(wrap(variant), truth) == 1.0, (variant, truth)
            checked += 1
    assert checked >= 12


def test_missing_answer_scores_0(scorer):
    assert scorer.score("I think it is 5.", "5") == 0.0
    assert scorer.score("<answer>5</answer>", "5") == 0.0


@pytest.mark.parametrize(
    ("response", "truth"),
    [(None, "1"), (123, "1"), ("\\boxed{1}", None), ("\\boxed{1}", ""), ("\\boxed{}", "1")],
)
def test_bad_inputs_score_0_without_raising(scorer, response, truth):
    assert scorer.score(response, truth) == 0.0


def test_megabyte_response_is_bounded(scorer):
    body = "<reason>" + "let me think about {this} \\boxed{" * 32000 + "</reason>"
    text = body + "<answer>\\boxed{42}</answer>"
    assert len(text) > 1_000_000
    start = time.perf_counter()
    assert scorer.score(text, "42") == 1.0
    assert scorer.score("\\boxed{" + "{" * 1_000_000, "1") == 0.0
    assert time.perf_counter() - start < BOUNDED_S


@pytest.mark.parametrize(
    "latex",
    [
        "9^{9^{9^{9}}}",
        "(10^{10^{10}})!",
        "\\frac{" * 500 + "1" + "}{2}" * 500,
        "x" + "^{x" * 300 + "}" * 300,
        "\\sqrt{" * 800 + "2" + "}" * 800,
        "2^{2^{2^{2^{2^{2^{2}}}}}} - 2^{2^{2^{2^{2^{2^{2}}}}}}",
    ],
)
def test_pathological_latex_is_bounded(scorer, latex):
    start = time.perf_counter()
    assert scorer.score(wrap(latex), "7") == 0.0
    assert time.perf_counter() - start < BOUNDED_S


def hang(pred: str, truth: str, inner_timeout_s: float) -> bool:
    """A verifier stuck in one C call: signals cannot interrupt it, only a kill can."""
    return sum(range(10**13)) > 0


def test_hung_verifier_is_killed_and_pool_recovers():
    with RewardScorer(timeout_s=1.0, num_workers=1, verify_fn=hang) as s:
        assert s.score(wrap("1"), "2") == 0.0
        assert s.stats.timeouts == 1
        assert s.score(wrap("1"), "2") == 0.0  # the timeout is cached
        assert s.stats.cache_hits == 1
        assert s.score(wrap("5"), "5") == 1.0  # exact match needs no worker
        start = time.perf_counter()
        assert s.score(wrap("1"), "3") == 0.0  # a replacement worker serves (and hangs) again
        # bound plus a warm respawn, with room for a loaded machine
        assert time.perf_counter() - start < 1.0 + 4.0
        assert s.stats.timeouts == 2


async def test_async_batch_does_not_block_the_loop():
    order: list[str] = []

    async def other_work():
        await asyncio.sleep(0)
        order.append("other")

    with RewardScorer(timeout_s=1.0, num_workers=1, verify_fn=hang) as s:
        scores, _ = await asyncio.gather(s.ascore_batch([wrap("1")], ["2"]), other_work())
        order.append("scores")
    assert scores == [0.0]
    assert order == ["other", "scores"]


async def test_async_batch_scores(scorer):
    truths = ["1", "\\frac{1}{2}", "3"]
    preds = [wrap("1"), wrap("0.5"), wrap("4")]
    assert await scorer.ascore_batch(preds, truths) == [1.0, 1.0, 0.0]


def test_cache_hits_on_repeat(scorer):
    before = scorer.stats.cache_hits
    scorer.score(wrap("\\dfrac{2}{4}"), "\\frac{1}{2}")
    scorer.score(wrap("\\dfrac{2}{4}"), "\\frac{1}{2}")
    assert scorer.stats.cache_hits == before + 1


def test_use_after_close_is_a_clear_error():
    s = RewardScorer(num_workers=1)
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.score(wrap("1"), "2")


def test_module_level_score_never_raises():
    from rstar2.reward import reset_default_scorer, score

    try:
        assert score(wrap("\\frac{6}{8}"), "0.75") == 1.0
        assert score(wrap("1"), "2") == 0.0
    finally:
        reset_default_scorer()


@given(st.integers(min_value=-(10**12), max_value=10**12))
@settings(max_examples=50, deadline=None)
def test_integers_and_their_respellings_score_1(scorer, n):
    truth = str(n)
    assert scorer.score(wrap(samples.respell(truth)), truth) == 1.0
    assert scorer.score(wrap(samples.wrong(truth)), truth) == 0.0
