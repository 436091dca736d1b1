"""Knowledge distillation pieces behind `hone distill` (hone/recipes/distill.py): the teacher and
student models, the train and evaluation losses, the offline top-k cache, sequence-level data
and on-policy (GKD) sampling."""
