"""An evaluation whose metrics no gather can collect runs over the whole set on every process (ACC146,
accelify.analyses.unsharded): its loader is not prepared, its batches are placed on the accelerator's
device; refused as before wherever that is not sure."""

from __future__ import annotations

from conftest import assert_stable, convert

SETUP = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
train_loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,))), batch_size=8, shuffle=True)
test_loader = DataLoader(TensorDataset(torch.randn(40, 8), torch.randint(0, 4, (40,))), batch_size=8)
model = torch.nn.Linear(8, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""

TRAIN = """\
for x, y in train_loader:
    x, y = x.to(device), y.to(device)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

# a hit rate over the top 2 of each batch's scores: ranked across the batch's samples, no gather pairs it
TOP_K = """\
def hit_rate(net, loader):
    hits = []
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        scores = net(x)
        _, best = torch.topk(scores.max(dim=1).values, 2)
        hits.append(y[best].eq(0).float().mean().item())
    return sum(hits) / len(hits)
"""


def _codes(result) -> list[str]:
    return [f.code for f in result.findings]


def test_a_top_k_metric_leaves_its_loader_whole() -> None:
    source = SETUP + TOP_K + TRAIN + "print(hit_rate(model, test_loader))\n"
    result = convert(source)
    assert result.changed and "ACC146" in _codes(result), result.findings
    out = result.output
    assert "accelerator.prepare(train_loader, model, optimizer)" in out  # not test_loader
    assert "x, y = x.to(accelerator.device), y.to(accelerator.device)" in out  # placed by the script still
    assert "gather" not in out
    note = next(f for f in result.findings if f.code == "ACC146")
    assert "`test_loader` is not prepared" in note.message and "topk" in note.message
    assert "File not converted" not in note.message
    assert_stable(out)


def test_a_helper_that_places_the_batches_is_handed_the_accelerator() -> None:
    header, _, objects = SETUP.partition("\ndevice =")
    body = "".join("    " + line + "\n" for line in ("device =" + objects + TRAIN).splitlines())
    source = (header + "\n\n" + TOP_K + "\n\ndef main():\n" + body + "    print(hit_rate(model, test_loader))\n\n\n"
              "if __name__ == \"__main__\":\n    main()\n")
    result = convert(source)
    assert result.changed and "ACC146" in _codes(result), result.findings
    out = result.output
    assert "def hit_rate(accelerator, net, loader):" in out
    assert "x, y = x.to(accelerator.device), y.to(accelerator.device)" in out
    assert "accelerator.print(hit_rate(accelerator, model, test_loader))" in out
    assert_stable(out)


def test_a_model_bound_again_through_eval_is_the_prepared_model() -> None:
    """PointNet: `test(classifier.eval(), loader)`, then `classifier = model.eval()` in `test`: the gather
    analysis does not follow that call, but it is the prepared model, so the loader is left whole."""
    top_k = TOP_K.replace("def hit_rate(net, loader):\n", "def hit_rate(model, loader):\n    net = model.eval()\n")
    result = convert(SETUP + top_k + TRAIN + "print(hit_rate(model.eval(), test_loader))\n")
    assert result.changed and "ACC146" in _codes(result), result.findings


def test_a_copy_of_the_model_evaluated_keeps_the_refusal() -> None:
    """An EMA copy made with `copy.deepcopy(model)` stays where it was made: its device is not the prepared
    model's, so accelify does not take that evaluation."""
    source = "import copy\n" + SETUP + TOP_K + TRAIN + "ema = copy.deepcopy(model)\nprint(hit_rate(ema, test_loader))\n"
    result = convert(source)
    assert not result.changed and "ACC146" not in _codes(result) and "ACC114" in _codes(result)


def test_without_the_fallback_the_file_is_refused() -> None:
    """The same metric over the loader that also trains: it must stay sharded, so no gather, no conversion."""
    source = SETUP + TOP_K + TRAIN + "print(hit_rate(model, train_loader))\n"
    result = convert(source)
    assert not result.changed
    assert "ACC114" in _codes(result) and "ACC146" not in _codes(result)


def test_a_loader_the_script_reads_otherwise_stays_prepared() -> None:
    source = SETUP + TOP_K + TRAIN + "first = next(iter(test_loader))\nprint(hit_rate(model, test_loader))\n"
    result = convert(source)
    assert not result.changed and "ACC114" in _codes(result)


def test_a_helper_that_reads_the_loader_otherwise_keeps_it_prepared() -> None:
    top_k = TOP_K.replace("    hits = []\n", "    hits = []\n    probe = next(iter(loader))\n")
    result = convert(SETUP + top_k + TRAIN + "print(hit_rate(model, test_loader))\n")
    assert not result.changed and "ACC114" in _codes(result)


def test_an_evaluation_on_the_main_process_only_is_still_refused() -> None:
    source = SETUP + TOP_K + TRAIN + "rank = 0\nif rank == 0:\n    print(hit_rate(model, test_loader))\n"
    source = source.replace("import torch\n", "import torch\nimport torch.distributed as dist\n", 1).replace(
        "rank = 0\n", "dist.init_process_group('gloo')\nrank = dist.get_rank()\n")
    result = convert(source)
    assert not result.changed and "ACC146" not in _codes(result)


def test_a_metric_reduced_by_hand_keeps_the_refusal() -> None:
    """An all_reduce written by hand would add up N copies of a whole-set metric."""
    source = (SETUP + TOP_K + TRAIN + "rate = torch.tensor(hit_rate(model, test_loader))\n"
              "torch.distributed.all_reduce(rate)\nprint(rate)\n").replace(
        "import torch\n", "import torch\nimport torch.distributed\n", 1)
    result = convert(source)
    assert not result.changed and "ACC146" not in _codes(result)


def test_a_distributed_sampler_keeps_the_refusal() -> None:
    source = (SETUP + TOP_K + TRAIN + "print(hit_rate(model, test_loader))\n").replace(
        "batch_size=8)\nmodel", "batch_size=8, sampler=DistributedSampler(test_set))\nmodel").replace(
        "from torch.utils.data import DataLoader, TensorDataset\n",
        "from torch.utils.data import DataLoader, TensorDataset\nfrom torch.utils.data.distributed import DistributedSampler\n")
    assert "DistributedSampler(test_set)" in source
    result = convert(source)
    assert "ACC146" not in _codes(result) and "test_loader" not in result.output.split("accelerator.prepare(")[-1].split(")")[0] \
        or not result.changed


def test_a_gatherable_evaluation_beside_stays_sharded_and_gathered() -> None:
    source = SETUP.replace(
        "model = ", "val_loader = DataLoader(TensorDataset(torch.randn(24, 8), torch.randint(0, 4, (24,))), batch_size=8)\n"
        "model = ") + TOP_K + TRAIN + """\
correct = 0
for x, y in val_loader:
    x, y = x.to(device), y.to(device)
    pred = model(x).argmax(dim=1)
    correct += (pred == y).sum().item()
print(correct, hit_rate(model, test_loader))
"""
    result = convert(source)
    assert result.changed, result.findings
    out = result.output
    assert "accelerator.prepare(train_loader, val_loader, model, optimizer)" in out.replace("\n", " ").replace(
        "(    ", "(").replace(",     ", ", ") or "val_loader" in out.split("accelerator.prepare(")[1].split(")")[0]
    assert "test_loader" not in out.split("accelerator.prepare(")[1].split(")")[0]
    assert "accelerator.gather_for_metrics((pred, y))" in out
    assert _codes(result).count("ACC146") == 1


def test_an_evaluation_script_is_not_left_whole() -> None:
    """No optimizer: the evaluation is the whole script, sharding it is what Accelerate is for."""
    source = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(TensorDataset(torch.randn(40, 8), torch.randint(0, 4, (40,))), batch_size=8)
model = torch.nn.Linear(8, 4)
model.load_state_dict(torch.load("model.pt"))
model.to(device).eval()
hits = []
with torch.no_grad():
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        _, best = torch.topk(model(x).max(dim=1).values, 2)
        hits.append(y[best].eq(0).float().mean().item())
print(sum(hits) / len(hits))
"""
    result = convert_source_codes(source)
    assert "ACC146" not in result


def convert_source_codes(source: str) -> list[str]:
    from accelify.core.pipeline import convert_source

    return [f.code for f in convert_source(source, "script.py").findings]
