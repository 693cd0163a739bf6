"""Run side: tokenizer, sessions, decoding, translator. Never imports torch or transformers."""
