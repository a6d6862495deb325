"""A TensorBoard writer is created and written by the main process (one event file, not one per
process): `writer = SummaryWriter(...)` whose every use is a statement of its own goes under
`if accelerator.is_main_process:` with its uses; `SummaryWriter(...) if flag else None` whose uses are
under `if writer is not None:` gets the main process as one more condition. Otherwise ACC127."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source

SCRIPT = """\
import torch
from torch.utils.tensorboard import SummaryWriter

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
{create}
model = torch.nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
for step, (x, y) in enumerate(data):
    x, y = x.to(device), y.to(device)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
{log}
{after}
"""


def convert(create: str, log: str, after: str = ""):
    return convert_source(SCRIPT.format(create=create, log=log, after=after), "train.py")


def test_a_writer_and_its_uses_go_to_the_main_process() -> None:
    result = convert('writer = SummaryWriter("runs")', '    writer.add_scalar("loss", loss.item(), step)',
                     "writer.close()")
    assert 'if accelerator.is_main_process:\n    writer = SummaryWriter("runs")\n' in result.output
    assert '    if accelerator.is_main_process:\n        writer.add_scalar("loss", loss.item(), step)\n' in result.output
    assert "if accelerator.is_main_process:\n    writer.close()\n" in result.output
    assert not [f for f in result.findings if f.code == "ACC127"]
    assert convert_source(result.output, "train.py").output == result.output


def test_an_optional_writer_gets_the_main_process_as_one_more_condition() -> None:
    result = convert('writer = SummaryWriter("runs") if torch.cuda.is_available() else None',
                     '    if writer is not None:\n        writer.add_scalar("loss", loss.item(), step)')
    assert ('writer = SummaryWriter("runs") if torch.cuda.is_available() and accelerator.is_main_process else None'
            in result.output)
    assert not [f for f in result.findings if f.code == "ACC127"]
    assert convert_source(result.output, "train.py").output == result.output


@pytest.mark.parametrize("create, log", [
    # handed to a function: its uses there are not seen
    ('writer = SummaryWriter("runs")', "    print(writer)"),
    # a collective in the logging statement: every process must make it
    ('writer = SummaryWriter("runs")', '    writer.add_scalar("loss", accelerator.gather(loss).mean(), step)'),
    # an optional writer used without the check
    ('writer = SummaryWriter("runs") if torch.cuda.is_available() else None',
     '    writer.add_scalar("loss", loss.item(), step)'),
])
def test_other_uses_keep_acc127(create, log) -> None:
    result = convert(create, log)
    assert 'SummaryWriter("runs")' in result.output and "is_main_process" not in result.output.split("for step")[0]
    assert any(f.code == "ACC127" and "every process logs" in f.message for f in result.findings)


def test_an_animation_or_image_saved_by_its_own_method_is_written_by_the_main_process() -> None:
    """dcgan_natsu: `anim = animation.ArtistAnimation(...)`, then `anim.save("celeba.gif")` on every process."""
    result = convert("import matplotlib.animation as animation\nfrom PIL import Image", "",
                     'anim = animation.ArtistAnimation(None, [])\nanim.save("celeba.gif")\n'
                     'im = Image.fromarray(x.numpy())\nim.save("last.png")\nresult = {}\nresult.save = print\n'
                     'result.save("not a file of PIL or matplotlib")')
    assert 'if accelerator.is_main_process:\n    anim.save("celeba.gif")\n' in result.output
    assert 'if accelerator.is_main_process:\n    im.save("last.png")\n' in result.output
    assert '\nresult.save("not a file of PIL or matplotlib")' in result.output
