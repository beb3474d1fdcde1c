"""Independent references for pipeshard's end-to-end tests.

forward.py  -- a NumPy forward pass written from the published formulas (llama, qwen2, qwen3),
               reading tensors with the `gguf` package. It shares no code with the engine.
tokenize.py -- tokenizers built from a GGUF file's vocabulary with the `sentencepiece` and
               `tokenizers` packages (used to obtain prompt ids for the tests).
"""
