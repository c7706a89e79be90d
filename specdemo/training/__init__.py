"""Training and evaluating drafters for a target: data generation from the target's own
answers, distillation, acceptance measurement and the model card (``train_draft``).

May import ``engine`` and ``models``; never the page, the benchmark or the command line.
"""
