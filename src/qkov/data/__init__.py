"""From text files to batches of token ids: corpus discovery, tokenizer training, cached token
arrays, and the repeated random tokens the paper uses to test for induction."""
