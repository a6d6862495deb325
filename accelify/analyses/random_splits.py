"""A data split drawn at random without a seed: every process would split differently.

One process splits its dataset once; under ``accelerate launch`` every process runs the split::

    train_set, val_set = random_split(dataset, [n_train, n_val])           # torch's global generator
    X_train, X_val, y_train, y_val = train_test_split(X, y, test_size=0.2)  # NumPy's global generator

With no ``generator=`` (``random_state=``) and no seed of that generator anywhere in the file, each
process draws its own split: the shards ``prepare`` hands the processes come from different training
sets, a sample one process validates on another trains on, and the gathered validation mixes the
splits. The seed a split needs is one every process shares (``torch.manual_seed(0)``, converted to
``set_seed``, or a generator of its own: ``generator=torch.Generator().manual_seed(0)``).

Input: the facts' calls.  Output: refusal ACC149, at each such split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from accelify.analyses.data import TORCH_SEEDS, seeded
from accelify.analyses.facts import Facts
from accelify.queries.names import code_of, has_qname

if TYPE_CHECKING:
    from accelify.analyses.plan import Plan

#: what seeds every generator at once (torch's, NumPy's, Python's)
_EVERY_GENERATOR = frozenset({"accelerate.utils.set_seed", "accelerate.utils.random.set_seed", "transformers.set_seed",
                              "lightning.seed_everything", "pytorch_lightning.seed_everything"})
_TORCH_SEEDS = TORCH_SEEDS | _EVERY_GENERATOR
_NUMPY_SEEDS = frozenset({"numpy.random.seed"}) | _EVERY_GENERATOR
#: the splits, the keyword that hands them a generator of their own and its position, and what seeds the
#: generator they draw from when none is handed
_SPLITS = {
    frozenset({"torch.utils.data.random_split", "torch.utils.data.dataset.random_split"}): (
        "generator", 2, _TORCH_SEEDS, "`generator=torch.Generator().manual_seed(0)`",
        "`torch.manual_seed(0)`, which accelify converts to `set_seed(0)`"),
    frozenset({"sklearn.model_selection.train_test_split"}): (
        "random_state", None, _NUMPY_SEEDS, "`random_state=0`", "`np.random.seed(0)`"),
}


def decide(facts: Facts, plan: Plan) -> bool:
    """False (ACC149, one finding per split) when the file splits its data at random without a seed."""
    found = False
    for call in facts.calls:
        for names, (keyword, position, seeds, own, seed) in _SPLITS.items():
            if not has_qname(facts, call.func, names) or _given(call, keyword, position):
                continue
            if seeded(facts, seeds):
                continue
            found = True
            facts.finding(
                plan, call, "ACC149",
                f"`{code_of(call.func)}(...)` splits the data at random without a seed: every process would draw a "
                "split of its own, so the shards the processes train on come from different training sets, and "
                "a sample one process validates on, another trains on. File not converted.",
                f"seed the split: hand it {own}, or seed the generator it draws from before it ({seed}); then run "
                "accelify again.",
            )
    return not found


def _given(call: cst.Call, keyword: str, position) -> bool:
    """The split is handed a generator (or a random state) of its own, by keyword or by position."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return any(a.keyword is not None and a.keyword.value == keyword for a in call.args) or (
        position is not None and len(positional) > position) or any(a.star for a in call.args)
