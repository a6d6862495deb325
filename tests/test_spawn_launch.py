"""ACC027: the ImageNet example's launch (``mp.spawn`` or a direct call of the worker) converted as its
distributed path, or the file left as it is when a launch flag cannot be decided everywhere."""

from __future__ import annotations

from conftest import FIXTURES, convert

SCRIPT = '''import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main():
    args = parser.parse_args()
    if args.gpu is not None:
        warnings.warn("You have chosen a specific GPU.")
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    ngpus_per_node = torch.cuda.device_count()
    if args.multiprocessing_distributed:
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)
    MAIN_TAIL


def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu
    if args.distributed:
        args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend="nccl", init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
    model = Net()
    if args.distributed:
        model.cuda(args.gpu)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    else:
        model = torch.nn.DataParallel(model).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.distributed:
        sampler = DistributedSampler(dataset)
    else:
        sampler = None
    loader = DataLoader(dataset, batch_size=8, shuffle=(sampler is None), sampler=sampler)
    for x, y in loader:
        x, y = x.cuda(args.gpu), y.cuda(args.gpu)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    WORKER_TAIL
'''


def script(main_tail: str = "pass", worker_tail: str = "pass") -> str:
    return SCRIPT.replace("MAIN_TAIL", main_tail).replace("WORKER_TAIL", worker_tail)


def test_the_launch_becomes_one_call_of_the_worker_on_its_distributed_path():
    result = convert(script(worker_tail="if args.rank % ngpus_per_node == 0:\n        torch.save(model.state_dict(), 'm.pt')"))
    out = result.output
    assert "main_worker(args)" in out and "def main_worker(args):" in out
    for gone in ("mp.spawn", "args.distributed", "multiprocessing_distributed", "DataParallel", "init_process_group",
                 "DistributedSampler", "args.rank", "args.world_size", ".cuda("):
        assert gone not in out, gone
    assert "if accelerator.is_local_main_process:" in out  # the first process of each machine, as before
    assert "accelerator.save(accelerator.unwrap_model(model).state_dict(), 'm.pt')" in out
    assert [c.line for c in result.changes if c.code == "ACC027"] == [14]  # the launch's `if`
    assert not result.findings


def test_before_the_worker_binds_it_args_gpu_is_still_the_option():
    out = convert(script()).output
    assert '    if args.gpu is not None:\n        warnings.warn("You have chosen a specific GPU.")' in out


def test_a_flag_read_where_it_cannot_be_decided_leaves_the_file_as_it_is():
    for tail in ("print(args.distributed)", "keep = args.multiprocessing_distributed", "log(args.rank)"):
        source = script(main_tail=tail)
        result = convert(source)
        assert result.output == source, tail
        # the launch as it is: spawn *or* call, and what else the unspecialised script holds
        assert {f.code for f in result.findings} == {"ACC126"}, tail
        assert any("`main_worker` is used elsewhere too" in f.message for f in result.findings), tail


def test_a_rank_read_in_the_worker_is_the_process_group_rank():
    out = convert(script(worker_tail="if args.rank == 0:\n        print('done')")).output
    assert "if accelerator.is_main_process:" in out


def test_what_the_distributed_path_cannot_convert_is_reported_at_its_line_in_the_file():
    source = script().replace("sampler = DistributedSampler(dataset)",
                              "sampler = DistributedSampler(dataset, drop_last=True)")
    result = convert(source)
    assert result.output == source
    line = source.splitlines().index("        sampler = DistributedSampler(dataset, drop_last=True)") + 1
    assert [(f.code, f.line) for f in result.findings] == [("ACC126", line)]
    assert "drop_last=True" in result.findings[0].message


def test_a_spawn_without_the_direct_call_is_not_this_launch():
    source = (FIXTURES / "ddp_spawn_runnable" / "before.py").read_text(encoding="utf-8")
    assert [c.code for c in convert(source).changes if c.code == "ACC027"] == []


def test_converted_code_converts_to_itself():
    out = convert(script()).output
    again = convert(out)
    assert again.output == out and not again.changes and not again.findings
