"""Training and evaluating drafters for a target: the target's answers written in one batched
generation loop (``generation``), grown into a resumable corpus (``corpus``, with ``prompts``
and ``passages``); the feature head trained on it (``eagle``), a draft carved from the target
(``carve``), their evaluation and learning curve (``evaluate``, ``curve``) and model card
(``card``); and the trainer that reproduces the previous draft LM, ``embedded-lm``
(``train_draft``).

May import ``engine`` and ``models``; never the page, the benchmark or the command line.
"""
