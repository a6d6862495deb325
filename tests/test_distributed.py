"""ACC018 / ACC126: a hand-written distributed script converts whole, or stays byte-identical with a
finding that names what accelify does not convert."""

from __future__ import annotations

import textwrap

import pytest

from accelify.core.pipeline import convert_source

HEAD = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

"""

TRAIN = """\
model = DDP(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def convert(body: str):
    source = HEAD + textwrap.dedent(body) + TRAIN
    return source, convert_source(source, "train.py")


def refused(body: str, *words: str) -> None:
    source, result = convert(body)
    assert result.output == source, "a refused file must come back byte-identical"
    assert [f.code for f in result.findings] == ["ACC126"], result.findings
    for word in words:
        assert word in result.findings[0].message, result.findings[0].message


def test_the_plain_torchrun_shape_converts():
    _, result = convert("""\
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
        """)
    assert result.error is None and not result.findings, result.findings
    for gone in ("init_process_group", "LOCAL_RANK", "DistributedSampler", "DDP(", "import os"):
        assert gone not in result.output, gone
    assert "loader = DataLoader(dataset, batch_size=8, shuffle=True)" in result.output


@pytest.mark.parametrize(
    "body, words",
    [
        ('dist.init_process_group("nccl")\nrank = int(os.environ.get("RANK", -1))\n'
         "loader = DataLoader(dataset, sampler=DistributedSampler(dataset))\n", ["default `-1`"]),
        ('dist.init_process_group("nccl")\n'
         "loader = DataLoader(dataset, sampler=DistributedSampler(dataset, drop_last=True))\n", ["drop_last=True"]),
        ('dist.init_process_group("nccl")\nloader = DataLoader(dataset, sampler=DistributedSampler(dataset))\n'
         "t = torch.ones(1)\ndist.all_reduce(t, op=dist.ReduceOp.MAX)\n", ["SUM or AVG"]),
        ('dist.init_process_group("nccl")\nloader = DataLoader(dataset, sampler=DistributedSampler(dataset))\n'
         "group = dist.new_group([0, 1])\n", ["new_group"]),
        ('dist.init_process_group("nccl")\nloader = DataLoader(dataset, sampler=DistributedSampler(dataset))\n'
         'print(os.environ["RANK"])\n', ['os.environ["RANK"]']),
        ('dist.init_process_group("nccl")\nsampler = DistributedSampler(dataset)\n'
         "loader = DataLoader(dataset, sampler=sampler)\nprint(len(sampler))\n", ["used for more than"]),
        ("import argparse\nparser = argparse.ArgumentParser()\n"
         'parser.add_argument("--local_rank", type=int, default=int(os.environ.get("RANK", 0)))\n'
         'args = parser.parse_args()\ndist.init_process_group("nccl")\n'
         "loader = DataLoader(dataset, sampler=DistributedSampler(dataset))\n", ["default of `--local_rank`"]),
    ],
)
def test_what_is_not_understood_refuses_the_whole_file_and_names_it(body, words):
    refused(body, *words)


def test_ddp_arguments_that_are_not_constants_refuse():
    source = HEAD + 'dist.init_process_group("nccl")\nloader = DataLoader(dataset, sampler=DistributedSampler(dataset))\n' \
        + TRAIN.replace("DDP(Net())", "DDP(Net(), find_unused_parameters=args.unused)")
    result = convert_source(source, "train.py")
    assert result.output == source and [f.code for f in result.findings] == ["ACC126"]
    assert "find_unused_parameters=args.unused" in result.findings[0].message


def test_matched_by_qualified_name_not_by_spelling():
    source = textwrap.dedent("""\
        import torch
        import torch.distributed as td
        from torch.nn import parallel
        from torch.utils.data import DataLoader, distributed as ud

        td.init_process_group("gloo")
        loader = DataLoader(dataset, batch_size=8, sampler=ud.DistributedSampler(dataset, shuffle=False))
        model = parallel.DistributedDataParallel(Net())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        if td.get_rank() == 0:
            torch.save(model.module.state_dict(), "model.pt")
        """)
    result = convert_source(source, "train.py")
    assert result.error is None and not result.findings, result.findings
    out = result.output
    assert "td." not in out and "DistributedDataParallel" not in out and "DistributedSampler" not in out
    assert "DataLoader(dataset, batch_size=8, shuffle=False)" in out
    assert "if accelerator.is_main_process:" in out
    assert "accelerator.unwrap_model(model).state_dict()" in out


def test_a_local_that_merely_shares_a_name_is_not_touched():
    source = textwrap.dedent("""\
        import torch

        def barrier():
            print("a barrier of this script's own")

        dist = {"rank": 0}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
        barrier()
        print(dist["rank"] == 0)
        """)
    out = convert_source(source, "train.py").output
    assert "barrier()\n" in out and 'dist["rank"] == 0' in out and "wait_for_everyone" not in out


def test_converted_code_is_left_as_it_is():
    _, result = convert("""\
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
        dist.barrier()
        if rank == 0:
            print("ready")
        """)
    again = convert_source(result.output, "train.py")
    assert again.output == result.output and not again.changes


@pytest.mark.parametrize("default", ['int(os.environ.get("LOCAL_RANK", 0))', 'int(os.environ["LOCAL_RANK"])',
                                     "int(os.environ.get('LOCAL_RANK', -1))"])
def test_a_local_rank_option_may_default_to_the_launchers_local_rank(default):
    """torchrun passes no `--local_rank`: scripts default the option to LOCAL_RANK. The read stays
    (the option too), and `args.local_rank` is the Accelerator's local rank."""
    _, result = convert(f"""\
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", "--local-rank", type=int, default={default})
        args = parser.parse_args()
        dist.init_process_group("nccl")
        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
        if args.local_rank == 0:
            print("ready")
        """)
    assert result.error is None and not result.findings, result.findings
    assert f"default={default})" in result.output
    assert "if accelerator.is_local_main_process:" in result.output
    assert "init_process_group" not in result.output and "DistributedSampler" not in result.output


@pytest.mark.parametrize("call", ["dist.all_reduce(t, dist.ReduceOp.SUM, async_op=False)",
                                  "dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=False)"])
def test_an_all_reduce_that_says_it_blocks_is_a_plain_sum(call):
    """The ImageNet example's meters: ``async_op=False`` is what ``all_reduce`` does anyway (it was refused as
    "asynchronous")."""
    _, result = convert(f"""\
        dist.init_process_group("nccl")
        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
        t = torch.ones(1)
        {call}
        """)
    assert result.error is None and not result.findings, result.findings
    assert 't = accelerator.reduce(t, reduction="sum")' in result.output and "async_op" not in result.output


def test_a_count_only_the_spawn_read_goes_with_it():
    """The DDP tutorials' ``world_size = torch.cuda.device_count()`` (and ``world_size = n_gpus``) before
    ``mp.spawn(main, args=(world_size, ...), nprocs=world_size)``: nothing reads it once the launch goes."""
    source = textwrap.dedent("""\
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from torch.nn.parallel import DistributedDataParallel as DDP


        def main(rank, world_size, epochs):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            model = DDP(Net())
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            dist.destroy_process_group()


        if __name__ == "__main__":
            n_gpus = torch.cuda.device_count()
            world_size = n_gpus
            print(f"{world_size} GPUs" if {kept} else "")
            mp.spawn(main, args=(world_size, 3), nprocs=world_size)
        """)
    gone = convert_source(source.replace("{kept}", "False").replace(
        '    print(f"{world_size} GPUs" if False else "")\n', ""), "train.py")
    assert gone.error is None and "device_count" not in gone.output and "world_size =" not in gone.output
    assert "    main(3)\n" in gone.output
    kept = convert_source(source.replace("{kept}", "True"), "train.py")  # read by a print too: it stays
    assert "n_gpus = torch.cuda.device_count()" in kept.output and "world_size = n_gpus" in kept.output


ACCELERATOR_API_SETUP = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    acc = torch.accelerator.current_accelerator()
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"{acc}:{rank}")
    backend = torch.distributed.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend)
    torch.accelerator.set_device_index(rank)


def main():
    ddp_setup()
    print(f"rank {dist.get_rank()} on {dist.get_backend()}")
    loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
"""


def test_the_torch_accelerator_set_up_goes_whole():
    """PyTorch's examples since torch.accelerator (minGPT's `ddp_setup`): the backend chosen for the device with
    `get_default_backend_for_device`, handed only to `init_process_group`, goes with it, and so do the device it was
    asked of and `torch.accelerator.set_device_index(rank)`; `dist.get_backend()` is the Accelerator's."""
    result = convert_source(ACCELERATOR_API_SETUP, "train.py")
    assert result.error is None and not result.findings, result.findings
    out = result.output
    for gone in ("ddp_setup", "get_default_backend_for_device", "current_accelerator", "set_device_index",
                 "LOCAL_RANK", "dist.", "import os"):
        assert gone not in out, gone
    assert 'accelerator.print(f"rank {accelerator.process_index} on {accelerator.state.backend}")' in out


def test_a_backend_read_elsewhere_is_still_refused():
    source = ACCELERATOR_API_SETUP.replace("    torch.accelerator.set_device_index(rank)\n",
                                           "    torch.accelerator.set_device_index(rank)\n    print(backend)\n")
    result = convert_source(source, "train.py")
    assert result.output == source and "get_default_backend_for_device" in result.findings[0].message
