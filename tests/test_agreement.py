"""The agreement of an imported model with its source (``qkov.interop.agreement``), on known answers:
a model whose every weight is zero gives uniform log-probabilities, ``-log V`` everywhere, so a
reference that raises one logit by ``log 2`` differs from it by exactly ``log(2V / (V + 1))``."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

import qkov
from qkov.interop.agreement import (
    checked_agreement,
    forward_reference,
    log_prob_difference,
    reference_file,
    reference_tolerance,
)

V = 5
CFG = qkov.Config(n_layers=1, n_heads=2, d_model=6, d_head=3, d_vocab=V, n_ctx=4)
TOKENS = torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1]])


def uniform_model() -> qkov.Transformer:
    model = qkov.AttnOnlyTransformer(CFG)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    return model


def raised_logit(base: float = 0.0) -> torch.Tensor:
    """Logits ``base`` everywhere but one, ``base + log 2``, at batch 1, position 2, token 3."""
    logits = torch.full((2, 4, V), base, dtype=torch.float64)
    logits[1, 2, 3] += math.log(2)
    return logits


def test_the_largest_difference_is_the_raised_logits():
    # at the raised position: token 3 has log(2 / (V + 1)), the others log(1 / (V + 1)); ours are
    # all log(1 / V); the largest gap is token 3's, log(2V / (V + 1)) = log(5/3) for V = 5
    difference = log_prob_difference(uniform_model(), TOKENS, raised_logit())
    assert difference == pytest.approx(math.log(2 * V / (V + 1)), rel=1e-14)
    assert difference == pytest.approx(math.log(5 / 3), rel=1e-14)


def test_logits_shifted_per_position_and_log_probabilities_agree_exactly():
    model = uniform_model()
    shifted = torch.arange(8.0, dtype=torch.float64).reshape(2, 4, 1).expand(2, 4, V) * 3.0
    assert log_prob_difference(model, TOKENS, shifted) == pytest.approx(0.0, abs=1e-14)
    log_probs = raised_logit().log_softmax(-1).float()  # float32 log-probabilities, read in float64
    expected = math.log(2 * V / (V + 1))
    assert log_prob_difference(model, TOKENS, log_probs) == pytest.approx(expected, abs=1e-6)
    assert log_prob_difference(model, TOKENS, raised_logit(base=-40.0)) == pytest.approx(expected, rel=1e-12)


def test_a_reference_of_the_wrong_shape_is_one_line():
    with pytest.raises(
        qkov.QkovError,
        match=r"^reference logits have shape \(2, 4, 6\), expected \(2, 4, 5\) \(the tokens' shape",
    ):
        log_prob_difference(uniform_model(), TOKENS, torch.zeros(2, 4, 6))


def test_the_agreement_line_and_the_refusal_above_the_tolerance():
    model = uniform_model()
    line = checked_agreement(model, TOKENS, raised_logit(), "the source", tolerance=1.0)
    assert line == "largest log-probability difference against the source: 5.1e-01 (2 x 4 tokens)"
    with pytest.raises(qkov.QkovError) as info:
        checked_agreement(model, TOKENS, raised_logit(), "the source")
    assert str(info.value) == f"the imported model disagrees: {line}, above the tolerance 0.0001"
    nan = raised_logit()
    nan[0, 0, 0] = float("nan")
    with pytest.raises(qkov.QkovError, match="disagrees: .* nan "):  # NaN never passes
        checked_agreement(model, TOKENS, nan, "the source", tolerance=1.0)


def test_the_default_reference_tokens_are_four_seeded_sequences():
    tokens, logits = forward_reference(uniform_model(), lambda t: t.double() * 2)
    expected = torch.randint(0, V, (4, 4), generator=torch.Generator().manual_seed(0))
    assert torch.equal(tokens, expected) and torch.equal(logits, expected.double() * 2)
    given, _ = forward_reference(uniform_model(), lambda t: t, TOKENS)
    assert given is TOKENS


def test_a_reference_file_holds_tokens_and_logits(tmp_path):
    save_file({"tokens": TOKENS, "logits": raised_logit()}, tmp_path / "ref.safetensors")
    tokens, logits = reference_file(tmp_path / "ref.safetensors")
    assert torch.equal(tokens, TOKENS) and torch.equal(logits, raised_logit())
    save_file({"tokens": TOKENS}, tmp_path / "half.safetensors")
    with pytest.raises(qkov.QkovError, match=r"half.safetensors: missing tensor logits \(a reference holds"):
        reference_file(tmp_path / "half.safetensors")


def test_a_float32_reference_is_judged_by_float32_rounding():
    """Float32 logits of size ~30 differ from float64 by float32 rounding, far below a layout error."""
    model = uniform_model()
    logits = raised_logit(30.0).float()
    assert reference_tolerance(logits.double()) == 1e-4
    allowed = reference_tolerance(logits)
    assert allowed == pytest.approx(1024 * torch.finfo(torch.float32).eps * abs(math.log(1 / 6)), rel=1e-6)
    with pytest.raises(qkov.QkovError, match="above the tolerance 0.0002"):
        checked_agreement(model, TOKENS, logits, "the source")  # log(5/3) apart: a layout error
    assert "5.1e-01" in checked_agreement(model, TOKENS, logits, "the source", tolerance=1.0)
