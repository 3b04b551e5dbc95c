"""A worked rlguard plugin: a torch-free detector (``loss_above``) and opt-in intervention (``halve_lr_on_loss``),
and an objective (``band_pg``) that imports torch, each module in the entry-point group of its kind."""
