"""Shapes of research DDP scripts (issue 27), each found in a real script of the DDP set."""

from __future__ import annotations

import pytest
from conftest import assert_stable, convert
from e2e import FIXTURES

SPAWNED = '''import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import optim
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


class LARS(optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))

    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-g["lr"])


def main_worker(gpu, args):
    dist.init_process_group(backend="gloo", init_method="env://", world_size=2, rank=gpu)
    model = Net()
    param_weights = []
    param_biases = []
    for param in model.parameters():
        if param.ndim == 1:
            param_biases.append(param)
        else:
            param_weights.append(param)
    parameters = [{"params": param_weights}, {"params": param_biases}]
    optimizer = LARS(parameters, lr=0.1)
    model = torch.nn.parallel.DistributedDataParallel(model)
    loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    args = parser.parse_args()
    mp.spawn(main_worker, (args,), 2)
'''


def test_spawn_given_its_arguments_by_position_and_an_optimizer_over_lists_filled_from_the_parameters():
    """Barlow Twins: `torch.multiprocessing.spawn(main_worker, (args,), ngpus_per_node)` and LARS over
    `[{'params': param_weights}, {'params': param_biases}]`, filled in a loop over `model.parameters()`."""
    result = convert(SPAWNED)
    out = result.output
    assert "main_worker(args)" in out and "def main_worker(args):" in out and "mp.spawn" not in out
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in out or (
        "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in out)


def test_an_optimizer_over_lists_filled_from_nothing_the_file_names_is_not_taken():
    source = SPAWNED.replace("for param in model.parameters():", "for param in gather_params():")
    result = convert(source)  # no model the lists come from: no optimizer accelify can prepare with its model
    assert result.output == source and {f.code for f in result.findings} & {"ACC107", "ACC125"}


TRUNCATED = '''import os
import torch
from torch.utils.data import DataLoader

device = "cuda" if torch.cuda.is_available() else "cpu"
loader = DataLoader(dataset, batch_size=8)
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
log_file = os.path.join("log", "log.txt")
with open(log_file, "w") as f:  # open for writing to clear the file
    pass
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
'''


def test_a_log_emptied_at_the_start_is_emptied_once():
    out = convert(TRUNCATED).output
    assert 'if accelerator.is_main_process:\n    with open(log_file, "w") as f:' in out


def test_data_split_by_the_scripts_own_loader_handed_the_rank_is_said_to_be():
    """build-nanoGPT's `DataLoaderLite(B, T, process_rank=ddp_rank, num_processes=ddp_world_size)`."""
    source = '''import os
import torch
from torch.distributed import init_process_group, destroy_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl")
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
else:
    ddp_rank = 0
    ddp_world_size = 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
train_loader = DataLoaderLite(B=4, T=8, process_rank=ddp_rank, num_processes=ddp_world_size)
model = Net().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
for step in range(10):
    for micro_step in range(4):
        x, y = train_loader.next_batch()
        x, y = x.to(device), y.to(device)
        loss = model(x, y)
        loss.backward()
    optimizer.step()
if ddp:
    destroy_process_group()
'''
    result = convert(source)
    note = next(f for f in result.findings if f.code == "ACC124")
    assert "handed the process's rank, which splits the data between the processes itself" in note.message
    assert "ddp_rank = accelerator.process_index" in result.output and "process_rank=ddp_rank" in result.output


LOSS_REDUCED = SPAWNED.replace('''class LARS(optim.Optimizer):''', '''class CrossCorrelation(torch.nn.Module):
    def forward(self, z1, z2):
        c = z1.T @ z2
        c.div_(z1.shape[0])
        torch.distributed.all_reduce(c)
        return (c - torch.eye(c.shape[0])).pow(2).sum()


class LARS(optim.Optimizer):''')


def test_an_all_reduce_the_accelerator_cannot_reach_is_accelerates_function():
    """Barlow Twins sums the cross-correlation over the processes inside the model's forward: there is
    no Accelerator there; `accelerate.utils.reduce` works on the process group it set up (a copy, in one
    process), so `c = reduce(c, reduction="sum")`."""
    result = convert(LOSS_REDUCED)
    assert '        c = reduce(c, reduction="sum")\n' in result.output
    assert "from accelerate.utils import reduce" in result.output
    runtime = convert(LOSS_REDUCED, target="runtime").output
    assert "from accelify.runtime import Accelerator, reduce" in runtime or "from accelify.runtime import reduce" in runtime


def test_reduce_already_a_name_of_the_file_is_not_shadowed():
    source = "from functools import reduce\n" + LOSS_REDUCED
    result = convert(source)
    assert result.output == source and "ACC126" in [f.code for f in result.findings]


def test_no_barrier_where_a_rank_test_accelify_does_not_know_keeps_the_other_processes_out():
    """Barlow Twins saves under `if args.rank == 0:` (`args.rank += gpu`, a rank accelify does not follow):
    a `wait_for_everyone()` inserted there would wait for processes that never come."""
    source = SPAWNED.replace("        optimizer.step()\n", "        optimizer.step()\n"
                             "    if args.rank == 0:\n"
                             "        torch.save(model.module.state_dict(), 'model.pt')\n")
    out = convert(source).output
    assert "accelerator.save(accelerator.unwrap_model(model).state_dict(), 'model.pt')" in out
    assert "wait_for_everyone" not in out


def test_a_world_size_counted_by_the_script_and_read_is_the_accelerators():
    """Barlow Twins: `args.world_size = args.ngpus_per_node` (the GPUs of the machine), handed to the process
    group and read for the batch of each process: read as the launcher's (ACC028), or on 2 processes of an
    8-GPU machine each would take an eighth of the batch (and on a CPU divide by zero)."""
    source = SPAWNED.replace('dist.init_process_group(backend="gloo", init_method="env://", world_size=2, rank=gpu)',
                             'dist.init_process_group(backend="gloo", init_method="env://", world_size=args.world_size, '
                             'rank=gpu)\n    per_device = args.batch_size // args.world_size')
    result = convert(source)
    assert "per_device = args.batch_size // accelerator.num_processes" in result.output
    assert "args.world_size" not in result.output
    assert "ACC028" in [c.code for c in result.changes]


def test_a_barrier_after_a_save_is_kept_when_a_method_and_a_model_call_share_its_callers_name():
    """JointBERT's `Trainer.train()` calls `self.model.train()`: following the callers of `save_model` up
    through `train` must not go round that name forever and give up (the barrier before `load_model`
    reading the saved model back was lost)."""
    source = '''import os
import torch
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, args, dataset):
        self.args = args
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = Net().to(self.device)
        self.loader = DataLoader(dataset, batch_size=8)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train(self):
        self.model.train()
        for step, (x, y) in enumerate(self.loader):
            x, y = x.to(self.device), y.to(self.device)
            loss = criterion(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            if step % 10 == 0:
                self.save_model()

    def save_model(self):
        self.model.save_pretrained(self.args.model_dir)

    def load_model(self):
        self.model = Net.from_pretrained(self.args.model_dir)


trainer = Trainer(args, dataset)
trainer.train()
trainer.load_model()
'''
    out = convert(source).output
    assert "self.accelerator.wait_for_everyone()" in out


def test_a_rank_read_where_no_accelerator_exists_is_named():
    """pytorch-distributed (tczhangzhi): `main_worker(args.local_rank, args.nprocs, args)` in `main()`, before
    the worker creates the Accelerator. The finding said "this distributed call" of a rank read; a read handed to
    the worker is the worker's rank."""
    source = SPAWNED.replace("    mp.spawn(main_worker, (args,), 2)\n", "    main_worker(args.local_rank, args)\n").replace(
        "if __name__", "parser.add_argument('--local_rank', type=int, default=0)\n\n\nif __name__")
    result = convert(source)
    assert "    main_worker(args.local_rank, args)\n" in result.output and "init_process_group" not in result.output
    # handed to the worker, whose parameter is a rank there, it stays; read otherwise where no Accelerator
    # exists, it is named
    printed = source.replace("    main_worker(args.local_rank, args)\n", "    print(args.local_rank)\n    main_worker(0, args)\n")
    result = convert(printed)
    assert result.output == printed
    finding = next(f for f in result.findings if f.code == "ACC126")
    assert finding.message.startswith("`args.local_rank` (a rank or a collective of the launch) is in the module")


BATCH_SHUFFLED = SPAWNED.replace('''class LARS(optim.Optimizer):''', '''class Shuffled(torch.nn.Module):
    @torch.no_grad()
    def shuffle(self, x):
        idx_shuffle = torch.randperm(x.shape[0])
        torch.distributed.broadcast(idx_shuffle, src=0)
        gpu_idx = torch.distributed.get_rank()
        if gpu_idx == 0:
            print("shuffled")
        return x[idx_shuffle.view(2, -1)[gpu_idx]]


class LARS(optim.Optimizer):''')


def test_a_broadcast_and_a_rank_in_a_model_ask_accelerates_state():
    """MoCo's batch shuffle, in the model: `torch.distributed.broadcast(idx_shuffle, src=0)` and
    `gpu_idx = torch.distributed.get_rank()`, where no Accelerator can be reached. The broadcast is
    accelerate's function (in place on the process group, the tensor as it is in one process); the rank
    name stays, bound to `PartialState().process_index`, and its reads and tests stay as written."""
    result = convert(BATCH_SHUFFLED)
    out = result.output
    assert "        idx_shuffle = broadcast(idx_shuffle, from_process=0)\n" in out
    assert "        gpu_idx = PartialState().process_index\n" in out
    assert "        if gpu_idx == 0:\n" in out and "[gpu_idx]]" in out
    assert "from accelerate.utils import broadcast" in out and "PartialState" in out.split("class Shuffled")[0]
    assert "ACC126" not in [f.code for f in result.findings]
    runtime = convert(BATCH_SHUFFLED, target="runtime").output
    assert "broadcast" in next(line for line in runtime.splitlines() if line.startswith("from accelify.runtime import"))
    assert_stable(out)


def test_a_broadcast_of_another_shape_is_refused():
    source = BATCH_SHUFFLED.replace("torch.distributed.broadcast(idx_shuffle, src=0)",
                                    "torch.distributed.broadcast(idx_shuffle, src=0, group=group)")
    result = convert(source)
    assert result.output == source
    finding = next(f for f in result.findings if f.code == "ACC126")
    assert "is not `broadcast(tensor, src)` of a named tensor" in finding.message


def test_an_attribute_named_like_an_import_does_not_block_it():
    """`torch.distributed.broadcast` itself names `broadcast` as an attribute: no clash with
    `from accelerate.utils import broadcast`; a name `broadcast` of the file's own does clash."""
    assert "= broadcast(" in convert(BATCH_SHUFFLED).output
    clashing = "from torch.distributed import broadcast as broadcast\n" + BATCH_SHUFFLED
    result = convert(clashing)
    assert result.output == clashing and "ACC126" in [f.code for f in result.findings]


REDUCED_BY_HELPER = '''import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def reduce_value(value):
    dist.all_reduce(value)
    return value


def evaluate(model, loader):
    correct = torch.zeros(1)
    for x, y in loader:
        pred = model(x).argmax(1)
        correct += (pred == y).sum()
    correct = reduce_value(correct)
    return correct.item()


def main():
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    test_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    model = DDP(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(evaluate(model, test_loader))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def test_gathered_counts_reduced_again_by_a_helper_drop_that_reduction():
    """WZMIAOMIAO's `sum_num = reduce_value(sum_num, average=False)` after an evaluation loop: the loop's
    predictions are gathered (ACC011), so every process holds the whole set's count, and the helper's
    all-reduce (kept: it reduces other values too) would double it on two processes. The helper sums its first
    parameter and returns it: on the gathered counts that is the identity, so the line goes with the gather
    (the fourteenth session converted it as it was; the fifteenth refused it)."""
    result = convert(REDUCED_BY_HELPER)
    out = result.output
    assert "gather_for_metrics((pred, y))" in out and "    correct = reduce_value(correct)\n" not in out
    assert "def reduce_value(value):\n    value = reduce(value, reduction=\"sum\")\n    return value\n" in out
    assert_stable(out)


@pytest.mark.parametrize("helper", [
    "def reduce_value(value):\n    dist.all_reduce(value)\n    return value * 1\n",  # returns something else
    "def reduce_value(value):\n    if value is None:\n        return 0\n    dist.all_reduce(value)\n    return value\n",  # not always
])
def test_gathered_counts_handed_to_a_helper_it_cannot_read_through_are_refused(helper):
    source = REDUCED_BY_HELPER.replace("def reduce_value(value):\n    dist.all_reduce(value)\n    return value\n", helper)
    result = convert(source)
    assert result.output == source
    finding = next(f for f in result.findings if f.code == "ACC126")
    assert source.splitlines()[finding.line - 1] == "    correct = reduce_value(correct)"
    assert "`reduce_value(correct)` adds up over the processes the counts" in finding.message


def test_the_suggested_all_reduce_in_place_converts_with_the_counts_gathered_once():
    source = REDUCED_BY_HELPER.replace("    correct = reduce_value(correct)\n", "    dist.all_reduce(correct)\n")
    out = convert(source).output
    assert "gather_for_metrics((pred, y))" in out and "all_reduce(correct)" not in out
    assert "reduce(correct" not in out and "reduce_value(correct)" not in out


def test_a_loader_wrapped_in_a_progress_bar_under_its_own_name_is_still_the_prepared_one():
    """WZMIAOMIAO's `if is_main_process(): data_loader = tqdm(data_loader, file=sys.stdout)` in the function
    handed the loader: the same batches behind a progress bar. It was ACC123 ("binds it again ... never goes
    through `prepare`")."""
    source = "from tqdm import tqdm\n" + REDUCED_BY_HELPER.replace(
        "    correct = reduce_value(correct)\n", "    dist.all_reduce(correct)\n").replace(
        "    correct = torch.zeros(1)\n", "    correct = torch.zeros(1)\n    if dist.get_rank() == 0:\n"
        "        loader = tqdm(loader)\n")
    result = convert(source)
    assert "ACC123" not in [f.code for f in result.findings]
    assert "        loader = tqdm(loader, disable=not accelerator.is_local_main_process)\n" in result.output or (
        "        loader = tqdm(loader)\n" in result.output), result.output
    assert "gather_for_metrics((pred, y))" in result.output


ELASTIC = '''import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def demo_basic():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device_id = rank % torch.cuda.device_count()
    model = nn.Linear(10, 5).to(device_id)
    ddp_model = DDP(model, device_ids=[device_id])
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(device_id)
    loss_fn(outputs, labels).backward()
    optimizer.step()


if __name__ == "__main__":
    demo_basic()
'''


def test_the_gpu_of_a_rank_on_its_machine_and_the_inputs_ddp_moved():
    """The DDP tutorial's elastic example: `device_id = rank % torch.cuda.device_count()` is the process's GPU on
    its machine (`local_process_index`): the placements on it are `accelerator.device`. It was refused with
    ACC121, "the script places nothing on a device", for a script that places its labels and its model. The
    input `torch.randn(20, 10)` reached the GPU through `DistributedDataParallel(..., device_ids=[device_id])`;
    the prepared model in one process moves nothing, so it is placed at the call."""
    result = convert(ELASTIC)
    out = result.output
    assert "ACC121" not in [f.code for f in result.findings]
    assert "device_id" not in out and "torch.cuda.device_count()" not in out
    assert "model = nn.Linear(10, 5).to(accelerator.device)\n" in out
    assert "outputs = ddp_model(torch.randn(20, 10).to(accelerator.device))\n" in out
    assert "labels = torch.randn(20, 5).to(accelerator.device)\n" in out
    assert_stable(out)


def test_a_rank_modulo_anything_else_is_no_rank_and_the_refusal_says_where_the_data_goes():
    """`rank % 4` is no GPU accelify knows: refused, and not with "places nothing on a device" (false: the
    script places its model and labels on `device_id`)."""
    source = ELASTIC.replace("rank % torch.cuda.device_count()", "rank % 4")
    result = convert(source)
    assert result.output == source
    finding = next(f for f in result.findings if f.code == "ACC121")
    assert "places nothing" not in finding.message and "places it on `device_id`" in finding.message


def test_a_hand_made_input_of_the_ddp_model_is_placed_in_a_script_that_places_on_a_device_too():
    """The same input where the script's device is one accelify knows (`torch.device("cuda", local_rank)`): the
    script places things itself, and the tensor it hands the model still reached the GPU only through DDP."""
    source = ELASTIC.replace("    device_id = rank % torch.cuda.device_count()\n",
                             "    local_rank = int(os.environ[\"LOCAL_RANK\"])\n"
                             "    device_id = torch.device(\"cuda\", local_rank)\n").replace("import torch\n", "import os\nimport torch\n", 1)
    out = convert(source).output
    assert "outputs = ddp_model(torch.randn(20, 10).to(accelerator.device))\n" in out


LOCAL_RANK_WORKER = '''import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=os.environ.get("LOCAL_RANK", -1))
parser.add_argument("--batch_size", type=int, default=16)


def main():
    args = parser.parse_args()
    args.nprocs = torch.cuda.device_count()
    main_worker(args.local_rank, args.nprocs, args)


def main_worker(local_rank, nprocs, args):
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(local_rank)
    model = torch.nn.Linear(4, 2).cuda(local_rank)
    args.batch_size = int(args.batch_size / nprocs)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=DistributedSampler(dataset))
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x.cuda(local_rank)), y.cuda(local_rank))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if args.local_rank == 0:
        torch.save(model.module.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
'''


def test_the_gpus_of_the_machine_divided_as_the_processes_are_the_accelerators_processes():
    """tczhangzhi/pytorch-distributed: `args.nprocs = torch.cuda.device_count()` in `main`, handed to the worker,
    which divides the batch by it (and averages all-reduced sums by it). Under `accelerate launch` the processes
    are the launcher's, and on the CPU the count is 0: where the Accelerator is reached, it is
    `accelerator.num_processes` (ACC143 says so); `main`, which only hands it on, keeps it."""
    result = convert(LOCAL_RANK_WORKER)
    out = result.output
    assert "    args.batch_size = int(args.batch_size / accelerator.num_processes)\n" in out
    assert "    args.nprocs = torch.cuda.device_count()\n    main_worker(args.local_rank, args.nprocs, args)\n" in out
    [note] = [f for f in result.findings if f.code == "ACC143"]
    assert note.message.startswith("`nprocs`, the GPUs of the machine (`torch.cuda.device_count()`)")
    assert_stable(out)


def test_the_gpus_of_the_machine_divided_by_where_no_accelerator_is_reached_are_refused():
    source = LOCAL_RANK_WORKER.replace("    main_worker(args.local_rank, args.nprocs, args)\n",
                                       "    print(64 // args.nprocs)\n    main_worker(args.local_rank, args.nprocs, args)\n")
    result = convert(source)
    assert result.output == source
    [finding] = [f for f in result.findings if f.code == "ACC126"]
    assert finding.line == 17 and "`args.nprocs` counts the GPUs of the machine, and `main`" in finding.message


def test_the_local_rank_handed_from_main_to_the_worker_that_creates_the_accelerator():
    """The same script dividing by `dist.get_world_size()`: `main` reads
    `args.local_rank` only to hand it to `main_worker`, where it is a rank (placements go); `args.local_rank == 0`
    in the worker, which gets `args` from `main`, is the Accelerator's local main process (left as it was, it
    would be -1 in one process and never save)."""
    source = LOCAL_RANK_WORKER.replace("args.batch_size / nprocs", "args.batch_size / dist.get_world_size()")
    result = convert(source)
    out = result.output
    assert out != source, [f.message for f in result.findings]
    assert "    main_worker(args.local_rank, args.nprocs, args)\n" in out
    assert "    if accelerator.is_local_main_process:\n" in out and "args.local_rank ==" not in out
    assert "int(args.batch_size / accelerator.num_processes)" in out
    assert ".cuda(" not in out and "set_device" not in out
    assert_stable(out)


WZ_MAIN = REDUCED_BY_HELPER.replace('''    test_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    model = DDP(torch.nn.Linear(4, 2))
''', '''    test_sampler = DistributedSampler(data, shuffle=False)
    test_loader = DataLoader(data, batch_size=8, sampler=test_sampler)
    model = torch.nn.Linear(4, 2)
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "initial.pt")
    dist.barrier()
    model.load_state_dict(torch.load("initial.pt"))
    model = DDP(model)
''').replace("    print(evaluate(model, test_loader))\n", "    print(evaluate(model, test_loader) / test_sampler.total_size)\n")


def test_the_padded_size_of_a_sampler_that_goes_is_the_dataset_for_gathered_counts():
    """WZMIAOMIAO's `acc = sum_num / val_sampler.total_size`: the DistributedSampler's size padded to a multiple
    of the processes (each process's share counted once; the dataset's own in one process). The counts gathered
    with `gather_for_metrics` cover the dataset once: `len(data)`. It was ACC126 ("used for more than the
    DataLoader")."""
    result = convert(WZ_MAIN)
    out = result.output
    assert "    accelerator.print(evaluate(accelerator, model, test_loader) / len(data))\n" in out, out
    assert "test_sampler" not in out and "DistributedSampler" not in out
    assert_stable(out)


def test_initial_weights_loaded_after_the_scripts_own_barrier_wait_once_and_are_no_checkpoint_of_the_wrapper():
    """WZMIAOMIAO: rank 0 saves the initial weights, `dist.barrier()`, every rank loads them, then
    `DistributedDataParallel(model)`. The barrier is already the wait the saving conversion would add (it added
    a second), and the weights were saved from and loaded into the plain model (ACC129 said the original's
    checkpoints had the wrapper's keys)."""
    result = convert(WZ_MAIN)
    out = result.output
    assert out.count("accelerator.wait_for_everyone()") == 1
    assert "    accelerator.wait_for_everyone()\n    model.load_state_dict(torch.load(\"initial.pt\"" in out
    assert not any(f.code == "ACC129" for f in result.findings)
    late = WZ_MAIN.replace('''    model.load_state_dict(torch.load("initial.pt"))
    model = DDP(model)
''', '''    model = DDP(model)
    model.load_state_dict(torch.load("initial.pt"))
''')
    assert any(f.code == "ACC129" for f in convert(late).findings)  # loaded into the wrapper: its keys


TWO_PATH = (FIXTURES / "ddp_two_path_runnable" / "before.py").read_text(encoding="utf-8")


def test_the_two_paths_of_the_old_hugging_face_examples_are_the_accelerators():
    """`if args.local_rank == -1:` (no launcher: one process) / `else:` (the process group): the launch test is
    `accelerator.use_distributed`, the launched path's set-up goes, and the sampler chosen by the same test is the
    single-process path's, which `prepare` shards. It was refused (ACC126, "a single-process path too")."""
    out = convert(TWO_PATH).output
    assert "    if not accelerator.use_distributed:\n        args.n_gpu = torch.cuda.device_count()\n" in out
    assert "    sampler = RandomSampler(train_set)\n" in out and "    eval_sampler = SequentialSampler(eval_set)\n" in out
    code = out.split('"""', 2)[2]  # not the docstring, which describes the original
    assert "local_rank == -1" not in code and "local_rank != -1" not in code and "DistributedSampler" not in code
    assert "    if accelerator.use_distributed:\n        accelerator.end_training()\n" in out
    assert_stable(out)


def test_a_sampler_chosen_by_the_launched_test_keeps_the_single_process_one():
    source = TWO_PATH.replace(
        "RandomSampler(train_set) if args.local_rank == -1 else DistributedSampler(train_set)",
        "DistributedSampler(train_set) if args.local_rank != -1 else RandomSampler(train_set)")
    assert "    sampler = RandomSampler(train_set)\n" in convert(source).output


def test_a_launch_test_where_no_accelerator_is_reached_is_refused():
    source = TWO_PATH.replace("\n\nif __name__", "\n\ndef launched(args):\n    return args.local_rank != -1\n\n\nif __name__")
    source = source.replace("    args = parser.parse_args()\n", "    args = parser.parse_args()\n    print(launched(args))\n")
    result = convert(source)
    assert result.output == source
    finding = next(f for f in result.findings if f.code == "ACC126")
    assert finding.message.startswith("`args.local_rank != -1` (a rank or a collective of the launch) is in `launched`")


PROCESS_LOOP = (FIXTURES / "ddp_process_loop_runnable" / "before.py").read_text(encoding="utf-8")


def test_processes_started_and_joined_in_loops_are_one_call_of_the_worker():
    """WZMIAOMIAO's `for rank in range(world_size): p = Process(target=main_fun, args=(rank, world_size, opt))`:
    `mp.spawn` by hand. The worker is called once without the rank and the world size (the launcher's); the
    set-up's report before `init_process_group` goes with it (it read `args.rank`, which the worker no longer
    sets); the pasted `init_distributed_mode` nothing calls goes too."""
    out = convert(PROCESS_LOOP).output
    code = out.split('"""', 2)[2]
    assert "    world_size = opt.world_size\n    main_fun(opt)\n" in code and "Process" not in code and ".join()" not in code
    assert "def main_fun(args):\n    accelerator = Accelerator()\n" in code
    assert "init_distributed_mode" not in code and "distributed init" not in code
    assert "lr=0.05 * accelerator.num_processes" in code
    assert_stable(out)


@pytest.mark.parametrize("change", [
    ("    for p in processes:\n        p.join()\n", ""),  # never joined
    ("p = Process(target=main_fun, args=(rank, world_size, opt))", "p = Process(target=main_fun, args=(rank, world_size, opt), daemon=True)"),
    ("        p.start()\n", "        p.start()\n        print(p.pid)\n"),
])
def test_processes_started_otherwise_are_refused(change):
    source = PROCESS_LOOP.replace(*change)
    result = convert(source)
    assert result.output == source
    assert any(f.code == "ACC126" for f in result.findings)


def test_a_set_up_helper_something_calls_is_not_taken_for_dead():
    source = PROCESS_LOOP.replace("    world_size = opt.world_size\n", "    print(init_distributed_mode)\n    world_size = opt.world_size\n")
    assert convert(source).output == source


def test_zero_redundancy_and_apex_are_refused_with_what_accelerate_offers_instead():
    """llm.c's `ZeroRedundancyOptimizer` (ZeRO stage 1 by hand: DeepSpeed's in Accelerate) and apex beyond
    what ACC033 replaces (`amp.state_dict()` in a checkpoint: the prepared optimizer is another object, without
    apex's `_amp_stash`)."""
    zero = convert((FIXTURES / "noop" / "ddp_zero_redundancy.py").read_text(encoding="utf-8"))
    [finding] = zero.findings
    assert "ZeRO stage 1" in finding.message and "DeepSpeed ZeRO stage 1" in finding.suggestion
    apex = convert((FIXTURES / "noop" / "apex_state_dict.py").read_text(encoding="utf-8"))
    [finding] = apex.findings
    assert finding.code == "ACC145" and finding.line == 21 and "`amp.state_dict` is NVIDIA apex" in finding.message
    assert 'mixed_precision="fp16"' in finding.suggestion


EMA = '''import copy

import torch
from torch.utils.data import DataLoader, TensorDataset


class ModelEMA:
    def __init__(self, model, decay):
        self.ema = copy.deepcopy(model)
        self.decay = decay

    def update(self, model):
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), model.parameters()):
                e.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)


def main():
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    model = torch.nn.Linear(4, 2)
    ema = ModelEMA(model, 0.99)
    loader = DataLoader(data, batch_size=8, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.update(model)


if __name__ == "__main__":
    main()
'''


def test_an_object_that_only_deep_copies_the_model_before_prepare_is_no_blocker():
    """FixMatch's `ModelEMA(args, model, decay)` before the optimizer: its `__init__` keeps `deepcopy(model)`,
    weights that are the same before `prepare` (ACC104 said it would keep the unprepared object); one that keeps
    the model itself still would."""
    assert "accelerator.prepare(" in convert(EMA).output
    kept = EMA.replace("self.ema = copy.deepcopy(model)", "self.ema = copy.deepcopy(model)\n        self.model = model")
    result = convert(kept)
    assert result.output == kept and [f.code for f in result.findings] == ["ACC104"]
