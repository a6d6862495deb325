"""The analyses behind :func:`accelify.plan.analyze`, one concern a module.

:mod:`~accelify.analyses.facts` collects what the file holds in one visit; the others each
decide one part of the :class:`~accelify.plan.Plan` from those facts and from what the
analyses before them decided, and report the findings of their concern.  ``plan._decide``
runs them in order; an analysis that refuses the file (a finding that leaves it as it is)
ends the run there.
"""
