"""Previous-token and induction-head detection: qkov against TransformerLens 3.x ``detect_head`` on
the same model and the same batch, side by side in one run (one thread).

    python benchmarks/heads.py                                # runs/reproduce/2-layer
    python benchmarks/heads.py --checkpoint runs/2-layer

The batch: 16 sequences of random tokens repeated twice, as long as TransformerLens accepts (it
rejects a sequence of n_ctx tokens, so n_ctx - 2 tokens). TransformerLens takes strings only: it
gets a word-level tokenizer that maps ``t17`` to token 17, so it sees exactly qkov's tokens (checked),
and runs one forward per string. Then the same on the hand-built perfect induction head of
``tests/handbuilt.py``, where qkov's induction score is 1.0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import qkov
from qkov.circuits.heads import induction_scores, previous_token_scores
from qkov.data.random_tokens import repeated_random_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from handbuilt import induction_model  # noqa: E402


def word_level_transformer_lens(model: qkov.AttnOnlyTransformer):
    """The model in TransformerLens, with a tokenizer whose words are the token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(model.cfg.d_vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # no BOS token: TransformerLens would otherwise reload the tokenizer by name from the Hub
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="t0", eos_token="t0", pad_token="t0"
    )
    hooked = qkov.interop.to_hooked_transformer(model)
    hooked.set_tokenizer(tokenizer)
    hooked.cfg.default_prepend_bos = False
    return hooked


REPS = 5


def best_of(fn, reps: int):
    """The result of ``fn()`` and its fastest time over ``reps`` calls."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return result, min(times)


def compare(model: qkov.AttnOnlyTransformer, tokens: torch.Tensor, period: int, label: str) -> None:
    from transformer_lens.head_detector import detect_head

    hooked = word_level_transformer_lens(model)
    strings = [" ".join(f"t{t}" for t in row.tolist()) for row in tokens]
    assert torch.equal(hooked.to_tokens(strings[0])[0].cpu(), tokens[0]), "TransformerLens sees other tokens"

    def qkov_scores():
        _, cache = model.run_with_cache(tokens)
        return previous_token_scores(cache), induction_scores(cache, period)

    def tl_scores():
        return detect_head(hooked, strings, "previous_token_head"), detect_head(
            hooked, strings, "induction_head"
        )

    with torch.no_grad():
        (ours, ours_s), (theirs, theirs_s) = best_of(qkov_scores, REPS), best_of(tl_scores, REPS)
    print(f"\n{label}: {tokens.shape[0]} sequences of {tokens.shape[1]} tokens (period {period})")
    print(
        f"  best of {REPS}: qkov {ours_s:.3f} s, TransformerLens detect_head {theirs_s:.3f} s: "
        f"{theirs_s / ours_s:.1f}x"
    )
    print(f"  {'head':>6} {'prev qkov':>10} {'prev TL':>10} {'ind qkov':>10} {'ind TL':>10}")
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            row = [float(s[layer, head]) for s in (ours[0], theirs[0], ours[1], theirs[1])]
            print(f"  {f'L{layer}H{head}':>6} " + " ".join(f"{x:10.3f}" for x in row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default="runs/reproduce/2-layer")
    parser.add_argument("--sequences", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = qkov.load(args.checkpoint)
    period = (model.cfg.n_ctx - 2) // 2
    gen = torch.Generator().manual_seed(0)
    tokens = repeated_random_tokens(args.sequences, period, 2, model.cfg.d_vocab, gen)
    compare(model, tokens, period, f"{args.checkpoint}")
    perfect = induction_model()
    distinct = torch.stack([torch.randperm(63, generator=gen)[:5] + 1 for _ in range(args.sequences)])
    distinct = distinct.repeat(1, 2)
    compare(perfect, distinct, 5, "hand-built perfect induction head (tests/handbuilt.py)")


if __name__ == "__main__":
    main()
