"""ACC022: a script that sets CUDA_VISIBLE_DEVICES itself would put every launched process on the
same GPU: the statement goes (the launcher assigns devices). Matched by qualified name."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
{imports}
import torch
from torch.utils.data import DataLoader

{setting}
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(dataset, batch_size=8)
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""


def convert(imports: str, setting: str):
    source = SCRIPT.format(imports=imports, setting=setting)
    result = convert_source(source, "train.py")
    assert result.error is None and result.output != source, result.findings
    return result.output, [c.code for c in result.changes]


@pytest.mark.parametrize("imports, setting", [
    ("import os", 'os.environ["CUDA_VISIBLE_DEVICES"] = opts.gpu_id'),
    ("import os as system", "system.environ['CUDA_VISIBLE_DEVICES'] = '0,1'"),
    ("from os import environ", 'environ.setdefault("CUDA_VISIBLE_DEVICES", args.gpus)'),
    ("import os", 'if args.gpu:\n    os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu'),
])
def test_the_script_no_longer_picks_its_gpus(imports, setting):
    out, codes = convert(imports, setting)
    assert "CUDA_VISIBLE_DEVICES" not in out
    assert "ACC022" in codes
    assert "import os" not in out and "from os import" not in out  # the import the line needed goes
    assert "if args.gpu" not in out  # an `if` emptied by it goes too


def test_other_variables_and_other_dicts_are_left_alone():
    out, codes = convert("import os\nenviron = {}",
                         'os.environ["TOKENIZERS_PARALLELISM"] = "false"\nenviron["CUDA_VISIBLE_DEVICES"] = "0"')
    assert 'os.environ["TOKENIZERS_PARALLELISM"] = "false"' in out
    assert 'environ["CUDA_VISIBLE_DEVICES"] = "0"' in out  # a local dict that shares the name
    assert "ACC022" not in codes


def test_idempotent():
    once, _ = convert("import os", 'os.environ["CUDA_VISIBLE_DEVICES"] = opts.gpu_id')
    again = convert_source(once, "train.py")
    assert again.output == once and not again.findings
