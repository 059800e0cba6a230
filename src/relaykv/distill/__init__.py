"""relaykv.distill: EAGLE drafts trained on the target's own text.

`relaykv distill-draft` (cli.py): the target generates a corpus in dense batches
(generate.py, data.py; tested against the engine's own generation, corpus.py) and its
hidden states are recorded, a draft is trained on it (trainer.py) and its acceptance measured on
held-out prompts (evaluate.py). Recipes per model: recipes.py. May import kvcache, model
and engine (docs/architecture.md); nothing below imports it: the drafts it builds are
shipped as checkpoints (`relaykv.model.drafts`). docs/model.md, "Distilling a draft".
"""
