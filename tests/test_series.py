"""A checkpoint series: every checkpoint measured exactly as the trainer measures its evaluations
(the same numbers as its metrics.jsonl), a hand-built series whose induction head forms between two
known steps judged by the phase-change rule, an interrupted series continued, and bad input refused
in one line with nothing written."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest
import torch

import qkov
from qkov.checkpoint import save
from qkov.cli import main
from qkov.data.shards import sampled_tokenizer, sharded_tokens
from qkov.data.sources import CorpusFiles
from qkov.interop.transformer_lens import to_transformer_lens
from qkov.results import load_results
from qkov.schedule import TrainConfig
from qkov.train import TRAIN_CONFIG_FILE, Trainer
from qkov.training_log import read_points, read_training_log, row_fields
from test_pickles import RunsCode, one_line_error

from handbuilt import induction_model

STEPS = [round(10 ** (k / 10)) for k in range(10, 51)]  # 10 to 100,000 steps, 10 a decade
RISE = (1000, 10000)  # the hand-built induction head forms between these steps
TOKENS_PER_STEP = 100


class KeepingTrainer(Trainer):
    """A trainer that also keeps every checkpoint in a folder of its own, ``checkpoints/step-N``, as
    runs that publish their checkpoints do."""

    def save_checkpoint(self) -> None:
        super().save_checkpoint()
        save(self.model, self.out / "checkpoints" / f"step-{self.step}", self.tokenizer)


@pytest.fixture
def one_thread():
    """Training on one thread: the machine's cores are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_series_of_a_qkov_run_measures_the_numbers_of_its_metrics_log(tiny_corpus, tmp_path, one_thread):
    corpus = CorpusFiles.find([str(tiny_corpus)])
    tokenizer = sampled_tokenizer(corpus, 300)
    cfg = qkov.Config(2, 2, 32, 16, tokenizer.get_vocab_size(), 32)
    train_cfg = TrainConfig(steps=40, batch_size=8, lr=1e-2, eval_every=20, checkpoint_every=10, seed=3)
    data = sharded_tokens(corpus, tokenizer, show_progress=False)
    KeepingTrainer(cfg, train_cfg, data, tmp_path / "run", tokenizer).run(show_progress=False)
    series = tmp_path / "run" / "checkpoints"
    shutil.copy(tmp_path / "run" / TRAIN_CONFIG_FILE, series)  # its batch size, seed and eval tokens
    main(
        [
            "series",
            str(series),
            "--out",
            str(tmp_path / "out"),
            "--corpus",
            str(tiny_corpus),
            "--quiet",
            "--threads",
            "1",
        ]
    )
    measured = {row.step: row for row in read_points(tmp_path / "out" / "series.jsonl")}
    assert sorted(measured) == [10, 20, 30, 40]
    logged = {row.step: row for row in read_training_log(tmp_path / "run")}
    common = sorted(set(measured) & set(logged))
    assert common == [10, 20, 40]  # step 30 was saved but not evaluated
    for step in common:
        trainer_row = row_fields(logged[step])
        del trainer_row["train_loss"]  # a checkpoint has no training loss
        assert row_fields(measured[step]) == trainer_row, step
        assert measured[step].tokens == step * 8 * 32
    results = load_results(tmp_path / "out" / "results.json")
    assert [row.step for row in results.training] == [10, 20, 30, 40]


def interpolated(start: qkov.AttnOnlyTransformer, end: qkov.AttnOnlyTransformer, step: int, rise=RISE):
    """The weights a fraction of the way from ``start`` to ``end``: 0 up to ``rise[0]``, 1 from
    ``rise[1]`` on, linear in log steps between."""
    a, b = (math.log10(s) for s in rise)
    t = min(1.0, max(0.0, (math.log10(step) - a) / (b - a)))
    first, last = dict(start.named_parameters()), dict(end.named_parameters())
    model = qkov.AttnOnlyTransformer(end.cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_((1 - t) * first[name] + t * last[name])
    return model


def tl_config(cfg: qkov.Config) -> dict:
    keys = ("n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_ctx")
    return {k: getattr(cfg, k) for k in keys} | {
        "normalization_type": None, "positional_embedding_type": "standard", "attn_only": True,
    }  # fmt: skip


def write_series(folder, start, end, steps=STEPS, rise=RISE):
    """A TransformerLens-style series: ``model_{step}.pth`` state dicts and one config.json."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(tl_config(end.cfg)))
    for step in steps:
        torch.save(to_transformer_lens(interpolated(start, end, step, rise)), folder / f"model_{step}.pth")
    return folder


def untrained(cfg: qkov.Config, seed: int = 0) -> qkov.AttnOnlyTransformer:
    model = qkov.AttnOnlyTransformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    return model


def copying_control(d_vocab: int, n_ctx: int, strength: float) -> qkov.AttnOnlyTransformer:
    """One layer, one head attending evenly to every earlier token (zero QK) and copying it to the
    logits (one-hot OV): in-context learning without induction."""
    cfg = qkov.Config(1, 1, d_vocab, d_vocab, d_vocab, n_ctx, positional_embedding="standard")
    model = qkov.AttnOnlyTransformer(cfg)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.W_E.copy_(torch.eye(d_vocab))
        model.W_U.copy_(torch.eye(d_vocab))
        model.blocks[0].attn.W_V[0].copy_(torch.eye(d_vocab))
        model.blocks[0].attn.W_O[0].copy_(strength * torch.eye(d_vocab))
    return model


def gentle_induction_model() -> qkov.AttnOnlyTransformer:
    """The hand-built induction model with a tenth of its attention scores and 0.15 of its induction
    head's output: as the weights grow along the series, its attention turns to the induction
    target over the same stretch in which its loss falls (the full scores of 100 turn it a tenth of
    the way in), and its guesses in the first copy, where nothing can be predicted, cost less than
    the held-out loss gains in the second (logits of 20 cost more)."""
    model = induction_model(d_vocab=16, n_ctx=12)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q[0] *= 0.1
        model.blocks[1].attn.W_O[0] *= 0.15
    return model


@pytest.fixture(scope="module")
def handbuilt_series(tmp_path_factory):
    """A 2-layer series from an untrained model to the hand-built induction model, rising between
    the steps of RISE, and a 1-layer control whose copying grows evenly over all four decades."""
    root = tmp_path_factory.mktemp("series")
    end = gentle_induction_model()
    write_series(root / "two", untrained(end.cfg), end)
    start, control = copying_control(16, 12, 0.0), copying_control(16, 12, 2.0)
    write_series(root / "one", start, control, rise=(STEPS[0], STEPS[-1]))
    return root


def run_series(root, out, *extra):
    args = ["series", str(root / "two"), "--out", str(root / out), "--tokens-per-step", str(TOKENS_PER_STEP)]
    main([*args, "--eval-tokens", "2048", "--quiet", "--threads", "1", *extra])
    return load_results(root / out / "results.json")


def test_the_handbuilt_series_shows_its_phase_change_inside_the_known_rise(handbuilt_series, capsys):
    results = run_series(handbuilt_series, "out")
    rows = results.training
    assert [row.step for row in rows] == STEPS and rows[0].tokens == 10 * TOKENS_PER_STEP
    before = [row.induction_score for row in rows if row.step <= RISE[0]]
    after = [row.induction_score for row in rows if row.step >= RISE[1]]
    assert max(before) == pytest.approx(min(before)) and min(after) == pytest.approx(max(after))
    assert min(after) > max(before) + 0.5  # the planted head attends to the token after
    change = results.phase_change
    start, end = (s * TOKENS_PER_STEP for s in RISE)
    assert start < change.window_start_tokens < change.window_end_tokens < end
    assert change.signatures == ["induction_score", "icl_score", "loss_bump"]
    assert change.slope_of == "eval_loss" and change.holds is None  # no control: undecided
    assert change.final_icl < change.initial_icl - 1.0  # the second copy is predicted: lower late loss
    assert rows[-1].eval_loss < rows[0].eval_loss
    out = capsys.readouterr().err
    assert "verdict: undetermined" in out and "41 checkpoints, 1,000 to 10,000,000 tokens" in out
    assert "1-layer control: none in these results" in out
    report = (handbuilt_series / "out" / "report.html").read_text()
    assert "d held-out loss / d log10 tokens" in report and "Phase change" in report


def test_with_a_one_layer_control_the_phase_change_holds(handbuilt_series, capsys):
    results = run_series(handbuilt_series, "with-control", "--control", str(handbuilt_series / "one"))
    control = results.phase_change.control
    # the control's in-context-learning gain over the window is far below half the 2-layer run's
    assert control.verdict == "holds" and control.gain < 0.5 * results.phase_change.icl_gain
    assert results.phase_change.holds is True
    control_rows = read_points(handbuilt_series / "with-control" / "control.jsonl")
    assert [row.step for row in control_rows] == STEPS
    assert max(row.induction_score for row in control_rows) < 0.11  # even attention to 6-12 tokens
    assert "verdict: holds" in capsys.readouterr().err
    report = (handbuilt_series / "with-control" / "report.html").read_text()
    assert "1-layer control model" in report


def test_an_interrupted_series_continues_where_it_stopped(handbuilt_series, capsys):
    out = handbuilt_series / "resumed"
    run_series(handbuilt_series, "resumed")
    file = out / "series.jsonl"
    lines = file.read_text().splitlines()
    kept = json.loads(lines[0]) | {"eval_loss": 123.0}  # a row the rerun must not measure again
    file.write_text("\n".join([json.dumps(kept), *lines[1:-5]]) + "\n")  # stopped 5 short
    results = run_series(handbuilt_series, "resumed")
    assert results.training[0].eval_loss == 123.0
    rewritten = file.read_text().splitlines()
    assert rewritten[-5:] == lines[-5:] and len(rewritten) == len(STEPS)
    capsys.readouterr()
    args = [
        "series",
        str(handbuilt_series / "two"),
        "--out",
        str(out),
        "--quiet",
        "--threads",
        "1",
        "--eval-tokens",
        "2048",
    ]
    err = one_line_error(capsys, [*args, "--tokens-per-step", "7"])
    assert "resumed: holds a series of other settings (series: " in err


def test_two_checkpoints_give_no_verdict_and_say_why(tmp_path, capsys):
    end = gentle_induction_model()
    write_series(tmp_path / "two", untrained(end.cfg), end, steps=[1000, 3000])
    main(
        [
            "series",
            str(tmp_path / "two"),
            "--out",
            str(tmp_path / "out"),
            "--label",
            "tokens",
            "--quiet",
            "--threads",
            "1",
        ]
    )
    err = capsys.readouterr().err
    assert "no verdict: 2 checkpoint(s) past zero tokens cannot place a phase-change window" in err
    results = load_results(tmp_path / "out" / "results.json")
    assert results.phase_change is None and [row.tokens for row in results.training] == [1000, 3000]
    assert results.training[0].step == 0 and results.training[1].step == 1  # by tokens: the index


def bad_series(tmp_path, kind):
    """A folder that is not a usable series, of the given kind."""
    folder = tmp_path / "src"
    cfg = qkov.Config(1, 1, 8, 4, 10, 6, positional_embedding="standard")
    step_size = ["--tokens-per-step", "10"] if kind != "no-step-size" else []
    if kind == "empty":
        folder.mkdir()
    elif kind == "one-checkpoint":
        save(untrained(cfg), folder)
    elif kind == "mixed-shapes":
        for step, d_model in ((10, 8), (20, 12)):
            save(untrained(qkov.Config(1, 1, d_model, 4, 10, 6)), folder / f"step-{step}")
    else:
        write_series(folder, untrained(cfg), untrained(cfg, 1), steps=[10, 20])
    if kind == "unlabelled":
        shutil.copy(folder / "model_10.pth", folder / "model_final.pth")
    elif kind == "mixed-kinds":
        save(untrained(cfg), folder / "step-30")
    elif kind == "runs-code":
        torch.save({"embed.W_E": RunsCode(tmp_path / "marker")}, folder / "model_30.pth")
    return folder, step_size


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("empty", r"src: no checkpoints \(weights files"),
        ("one-checkpoint", r"src: one checkpoint, not a folder of them \(qkov analyze reads"),
        ("unlabelled", r"model_final\.pth: no step or tokens at the end of its name"),
        ("mixed-kinds", "holds both weights files and checkpoint folders"),
        ("mixed-shapes", r"step-20: another model than step-10 \(mixed shapes or settings: d_model 8 vs 12"),
        ("runs-code", r"model_30\.pth: refused: the pickle would call \S*open, .* nothing was run"),
        ("no-step-size", "checkpoints labelled by steps need --tokens-per-step N"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, kind, message):
    folder, extra = bad_series(tmp_path, kind)
    err = one_line_error(
        capsys, ["series", str(folder), "--out", str(tmp_path / "out"), "--quiet", "--threads", "1", *extra]
    )
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists() and not (tmp_path / "marker").exists()


def test_the_control_must_be_one_layer(handbuilt_series, tmp_path, capsys):
    args = [
        "series",
        str(handbuilt_series / "two"),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
        "--threads",
        "1",
    ]
    args += ["--tokens-per-step", "1", "--control", str(handbuilt_series / "two")]
    assert "the control must be a 1-layer series, not 2" in one_line_error(capsys, args)
    assert not (tmp_path / "out").exists()


def test_repeating_text_puts_the_icl_positions_in_the_first_and_second_copy():
    from qkov.evaluation import icl_positions, repeating_text

    cfg = qkov.Config(2, 1, 8, 4, 50, 128)
    text = repeating_text(cfg, 129 * 3, torch.Generator().manual_seed(0))
    early, late = icl_positions(128)
    assert text.shape == (3, 129) and (early, late) == (6, 62)
    assert torch.equal(text[:, late : 2 * late], text[:, :late]) and torch.equal(text[:, 124:], text[:, :5])
    assert (text > 0).all()
    firsts = text[:, :late].numpy()
    assert not np.array_equal(firsts[0], firsts[1])


def test_icl_positions_are_the_papers_at_and_beyond_1024_tokens_and_scaled_below():
    from qkov.evaluation import icl_positions

    assert icl_positions(1024) == (50, 500)
    assert icl_positions(2048) == (50, 500)  # the paper's tokens, not scaled past its context
    assert icl_positions(512) == (25, 250)
    assert icl_positions(128) == (6, 62)
