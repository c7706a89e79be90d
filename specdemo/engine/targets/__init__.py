"""Targets: a model with its KV cache behind feed / score / roll back (a causal LM, an encoder-decoder
pair, no cache at all), the KV-cache policies, memory records, and the few-row products that make a
verification forward compute its rows as AR's one-row step does."""
