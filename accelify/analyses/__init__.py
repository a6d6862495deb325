"""The analyses behind :func:`accelify.analyses.plan.analyze`, one concern a module.

:mod:`~accelify.analyses.facts` collects what the file holds in one visit; the others each
decide one part of the :class:`~accelify.analyses.plan.Plan` from those facts and from what the
analyses before them decided, and report the findings of their concern.  ``plan._decide``
runs them in order; an analysis that refuses the file (a finding that leaves it as it is)
ends the run there.

- ``objects``: what to prepare: the optimizers, the models they train, the dataloaders.
- ``prepare_point``: the setup scope that builds them, and where ``prepare`` goes in it.
- ``accelerator``: the script's own Accelerator or the new one's name, and what its arguments can read.
- ``devices``: the device variables, and the flag that becomes ``Accelerator(cpu=...)``.
- ``helpers``: which helper parameters carry the objects, which helpers need the accelerator.
- ``schedulers``: the per-batch schedulers prepared with the optimizers.
- ``data``: whether the data a backward trains on comes from a prepared dataloader.
- ``mixed_precision``: a GradScaler and autocast become ``Accelerator(mixed_precision=...)``.
- ``gradient_accumulation``: a hand-written accumulation becomes ``gradient_accumulation_steps``.
- ``hazards``: what is wrong with several processes (and the backwards nothing can convert).
"""
