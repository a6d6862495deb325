"""The finding codes: what accelify recognises but leaves for a human, one line each.

The codemods say *where* and *what to do instead* when they report; this table is
what ``accelify rules`` and docs/findings.md list, and what ``--select``/``--ignore`` take.
"""

from __future__ import annotations

FINDINGS: dict[str, str] = {
    "ACC100": "The name `accelerator` (or `self.accelerator`) is already bound to something else (a variable, a definition, an import), or `Accelerator` is another package's: file left unchanged.",
    "ACC102": "The device is forced to the CPU, or chosen per rank or index, or the CPU is chosen both by a `--device` "
    "option and by another flag: file left unchanged.",
    "ACC103": "The device variable is assigned more than once: file left unchanged.",
    "ACC104": "The training objects are not built in one block, one of them is bound only under a condition (or can "
    "be None), or bound again after training starts and trained again (or a dataloader or optimizer bound again): "
    "file left unchanged. A look at a batch before the model is built does not count; a model built again after "
    "training to reload a checkpoint is converted (a plain model on `accelerator.device`).",
    "ACC105": "`scaler.scale(loss).backward()`: left as it is, `accelerator.backward` would scale the loss twice.",
    "ACC106": "`.backward()` in code that cannot reach the Accelerator (a module others import, a helper called "
    "from elsewhere): file left unchanged (with `--select`: that backward left as it is).",
    "ACC107": "Optimizers built in more than one function, in a factory that returns them (other than a plain "
    "function called once as `a, b, c = factory()` returning only optimizers, their models and datasets: those "
    "are prepared where they are unpacked), or in a trainer method "
    "(`Trainer.train`) that is not called exactly once, outside a loop: file left unchanged. A trainer method called "
    "once is converted (`prepare` there, the Accelerator created in `__init__`). Also an optimizer over parameters "
    "accelify cannot tie to a model (`Adam(params=grad_vars)`, the list a factory returns): prepared alone, the model "
    "would never be wrapped for distributed training.",
    "ACC108": "A placement accelify cannot map (an unknown device in a loop, a prepared model moved to the CPU): "
    "left as it is. The model or batches placed on a device chosen outside the function that trains (a "
    "module-level `device` used in `main()` that reads a flag of the script or is one of several: the automatic "
    "choice alone is converted, ACC031) or handed in, or a `--device` option read inside a helper handed "
    "the whole namespace or parsed after the model is built: file left unchanged.",
    "ACC109": "A placement (`.cuda()`, `.to(\"cuda:0\")`) in code that cannot reach the Accelerator (left as it is, "
    "it places on CUDA, or on one GPU for every process, not on `accelerator.device`), or a `.module` of a model "
    "whose DataParallel wrapper is removed, in such code: file left unchanged.",
    "ACC110": "Gradient clipping in code that cannot reach the Accelerator: file left unchanged (it would clip "
    "still-scaled gradients under mixed precision).",
    "ACC111": "A checkpoint of the whole training state saved with `torch.save`: saved once with `accelerator.save`, "
    "the models in it unwrapped (right for one device or DDP); reported: `accelerator.save_state`/`load_state` "
    "also cover sharded training. In code that cannot reach the Accelerator: left as it is, reported.",
    "ACC112": "Mixed precision that cannot be mapped (switched by different `enabled=` flags or in some places only, "
    "a scaler saved or passed around, float16 and bfloat16 mixed): left as it is.",
    "ACC113": "A per-batch scheduler sized from `len(dataloader)` taken before `prepare` that cannot be prepared with "
    "the others (built under a condition, or after code that reads the dataloaders): reported, it would decay N times "
    "too slowly with N processes. Otherwise `prepare` goes after it and takes it too.",
    "ACC114": "Evaluation metrics over a prepared dataloader that accelify cannot gather (code that cannot reach "
    "the Accelerator, no `output = model(...)` to gather, a metric before the model runs, an output read whole and "
    "in parts, gathered values also used by other code or sliced along their first dimension, a model output read "
    "with `.item()`: one number per batch, a loader with a batch sampler of its own), an evaluation loop "
    "that stops after some batches (`if i >= n: break`: each process would stop in its own shard), or an evaluation "
    "run on the main process only (under `if rank == 0:`, where a gather would hang): each process would count its "
    "own shard only; file left unchanged.",
    "ACC115": "Retired: a DistributedSampler is now removed (ACC018), or the file is left unchanged (ACC126).",
    "ACC116": "A collective (`wait_for_everyone`, `gather`, `reduce`, ...) under a main-process check: the run "
    "would hang; reported.",
    "ACC117": "Gradient accumulation done by hand that `accelerator.accumulate` would not reproduce exactly "
    "(no step at the end of the dataloader, a divided loss that is logged, ...): kept working as it is and reported.",
    "ACC118": "An optimizer wrapper (Lookahead, ScheduledOptim, ...): `prepare` only wraps `torch.optim.Optimizer`, "
    "so accumulation and mixed precision are not converted; reported.",
    "ACC119": "A `break`/`return` out of the training loop decided by a value each process computes from its own "
    "shard (a validation loss, a batch loss), where ACC026 cannot take it together (a `return`, or under another "
    "condition): processes would stop at different steps; reported "
    "(`accelerator.set_trigger()` + `accelerator.check_trigger()`).",
    "ACC120": "A method of the model itself (`model.encode(...)`) called in the training step after `prepare`: "
    "the DistributedDataParallel wrapper of a multi-process run does not have it, and the plain model would skip "
    "its gradient synchronisation; file left unchanged. Elsewhere ACC016 uses `accelerator.unwrap_model(model)`.",
    "ACC121": "No DataLoader and no device in the script, or no device and a tensor made by hand given to a "
    "model (a GAN's noise): `prepare` would move the model to the accelerator and leave hand-made data on the CPU; "
    "file left unchanged.",
    "ACC122": "A scheduler stepped both once per batch and outside the batch loop: no `prepare` choice keeps its "
    "learning rates those of one process; file left unchanged.",
    "ACC123": "The training loop draws from a DataLoader accelify cannot prepare (built elsewhere, passed in, held "
    "in a dict of loaders, or returned by a helper that may return something else), or with `next(it)` from an "
    "iterator made of one before `prepare` runs that cannot be made right after it instead (read before it, made "
    "twice, by a call other than `iter` or a generator of the file; no seed): every process would train on all of "
    "it; file left unchanged. A helper of the file that builds and returns the loaders (`train, test = get_loaders()`) is fine: "
    "they are prepared where it is called. Also a function handed the prepared DataLoader that binds that parameter "
    "to a new loader (`loader = sample_data(dataset, resolution)`), a prepared DataLoader bound to a new loader "
    "inside the loop that trains (StyleGAN's new loader at each resolution), and a function handed a prepared "
    "DataLoader at "
    "one call and an unprepared one at another.",
    "ACC124": "The training data is no DataLoader (hand-sliced tensors, `get_batch()`): converted, but not "
    "sharded, every process trains on all of it; reported (with a converted file only).",
    "ACC125": "A backward pass with no optimizer accelify recognises (parameters updated by hand, an optimizer "
    "from a factory): file left unchanged.",
    "ACC126": "A script that manages its own processes with something accelify does not convert (an `mp.spawn`ed "
    "worker also called directly, an `all_gather` of evaluation counts or into a list not built for it, `broadcast`, process subgroups, FSDP, `require_backward_grad_sync`, "
    "gradients all-reduced by hand, a rank with a single-process default): the "
    "finding names it; file left unchanged (half a conversion would wrap the model or shard the data twice).",
    "ACC127": "A logger (`wandb.init` where the Accelerator cannot be reached, a `SummaryWriter` handed on or used inside an expression), a file opened for "
    "writing that may differ between processes (not a log whose block only writes to it, nor the run's settings: "
    "those are written by the main process), or a download (`download=True`) outside the setup code, that every "
    "process runs: left as it is; reported (`if accelerator.is_main_process:`, "
    "`with accelerator.main_process_first():`).",
    "ACC128": "A model saved with `torch.save` in code that cannot reach the Accelerator, or the `state_dict()` of a "
    "model handed in as a parameter accelify does not follow (an early-stopping callback's `save_checkpoint(self, "
    "val_loss, model)`): every process would write it, with the wrapper's `module.` keys; file left unchanged. "
    "Also a checkpoint written through a handle every process opens (`with open(path, \"wb\") as f: torch.save(state, "
    "f)`): saved once, the other processes would still truncate it.",
    "ACC130": "The script reads back the sampler a prepared DataLoader was built with (`len(loader.sampler)`): "
    "after `prepare` the loader's `.sampler` is another one, over the whole dataset: file left unchanged.",
    "ACC131": "An evaluation (a script, or a loop of a training script that runs no backward) writes its results batch "
    "by batch inside the loop over the prepared DataLoader (`f.write` "
    "per batch): each process would write its own shard into the same file: file left unchanged.",
    "ACC132": "An inference loop over a list (`for prompt in prompts:`) that runs the model cannot be split between "
    "the processes with the same result (it prints or writes per item, adds up a counter, stops early, reads its "
    "results so far): file left unchanged.",
    "ACC133": "An evaluation or inference script (a DataLoader, a model in eval mode) whose model and DataLoader "
    "accelify cannot pair in one loop (the loader kept in a dict, built in the helper the model is handed to, the "
    "model run through another object): file left unchanged.",
    "ACC134": "The training data is no DataLoader and is drawn at random without a seed (`random.shuffle`, "
    "`torch.randperm`, random offsets): every process would draw its own batches, so each step would average N "
    "different batches and an epoch would be N passes, not the one-process training: file left unchanged.",
    "ACC135": "The training data, or the placement of the tensors, comes from a function of another module (`from "
    "utils import get_data`, `cuda(x, use_cuda)`, or a name a `from utils import *` brings) that accelify cannot "
    "vouch for (not a file beside the script, or one that places tensors, downloads, writes or calls more code of "
    "the project): whether it is a DataLoader to shard, or what it moves where, is unknown: file left unchanged. "
    "Also a script that trains nothing itself and runs a class or function of a module beside it that trains "
    "(`Solver(args).train()`), when the two cannot be converted as one program: nothing changed, and it says so. "
    "(A script and the module it trains in are converted together when they can be: see docs/projects.md.)",
    "ACC136": "The device was the GPU an option picks (`f\"cuda:{args.gpu_id}\"`, `torch.device(\"cuda\", "
    "args.gpu)`): it is now `accelerator.device`, the GPU the launcher gives each process; converted, reported "
    "(`CUDA_VISIBLE_DEVICES=1` trains one process on GPU 1). When the option also picks a GPU elsewhere "
    "(`torch.cuda.set_device(args.gpu)`), ACC102.",
    "ACC137": "A batch skipped before its backward pass on a value each process computes from its own shard, "
    "inside another condition (`if a: if torch.isnan(loss): continue`): the processes would run different numbers "
    "of backward passes, and the check every process must make to skip together (ACC026) cannot go there; file "
    "left unchanged.",
    "ACC129": "A DataParallel wrapper removed from a model that loads a state dict: checkpoints saved by the original "
    "script from the wrapped model have `module.` keys and will not load; converted, reported.",
    # ACC14x: notebooks, projects and what a conversion tells (ACC13x is left to the analysis of scripts).
    "ACC140": "A notebook cell accelify cannot read as Python even with IPython syntax masked (a syntax error, an "
    "unknown cell magic), or a line magic that runs training code (`%time train()`): if the cell mentions training "
    "the whole notebook is left unchanged, otherwise the cell is left as it is and the rest converted. A cell of "
    "another language (`%%bash`, `%%writefile`) that mentions training is left as it is and reported.",
    "ACC141": "A module beside the script whose definitions the script's conversion would change (it trains in "
    "them), and that another file of the project uses too (`finetune.py` calling the same `train(model, device, "
    "...)`): changed, they would no longer fit that file's calls, so nothing changes; or a module two scripts of "
    "one run would convert differently: the module and those scripts are left unchanged. Give each script a "
    "training function of its own. Also a module one script would make print through `PartialState().print` "
    "while another uses it before its `Accelerator(cpu=...)` (such a print would set the processes' state up "
    "first, and `cpu=True` on a GPU machine would stop with Accelerate's ValueError): the module and both scripts "
    "are left unchanged (or, the module printing so already, that script); create that Accelerator first.",
    "ACC142": "The optimizer is built in a function for the model it is handed (`def train(model, loader, args): "
    "optimizer = Adam(model.parameters())`): the model and the loaders are prepared where they are built, the "
    "optimizer in that function right after it is built (`optimizer = accelerator.prepare(optimizer)`), as "
    "Accelerate's FSDP examples do. Right for one device, DDP, FSDP (version 1) and mixed precision; DeepSpeed and "
    "FSDP2 take a model and its optimizer in one `prepare` call and stop with an error: converted, reported.",
    "ACC143": "A script that spawned one process per GPU of its machine (ACC027), or was launched with one and "
    "counted them with `torch.cuda.device_count()`, divided by that count (`args.batch_size / ngpus_per_node`, "
    "`/ args.nprocs`): it is now `accelerator.num_processes`, the processes of the whole run. "
    "The same on one machine; on several, the batch of a machine is divided by all processes: converted, "
    "reported.",
    "ACC144": "A device whose test read the script's device setting (nanoGPT's `device_type = 'cuda' if 'cuda' in "
    "device else 'cpu'`, `device = 'cuda'` overridable by `--device=cpu`): the setting no longer chooses the "
    "device, Accelerate does (each process its GPU, the CPU without one; `accelerate launch --cpu` for the CPU "
    "where there is a GPU): converted, reported.",
    "ACC145": "NVIDIA apex used beyond what ACC033 replaces (its `DistributedDataParallel`, `amp.state_dict()` in a "
    "checkpoint, several models, a branch doing more than apex): apex patches the optimizer it is handed and scales "
    "the loss through it, and the optimizer `prepare` returns is another object: file left unchanged, with the "
    "suggestion to use the Accelerator's mixed precision instead.",
    "ACC146": "An evaluation whose metrics no gather can collect (a top-k over the batch, a model call accelify "
    "does not follow, a value rebuilt batch after batch), over a loader only evaluations read: the loader is not "
    "prepared, and every process evaluates the whole set (metrics of the whole set, as in one process; N times "
    "the evaluation's work): converted, reported.",
    "ACC147": "The optimizer trains an `nn.ModuleList` or `nn.ModuleDict` the script never calls (it calls the "
    "modules in it): prepared, its DistributedDataParallel wrapper would never run and no gradient would be "
    "averaged between the processes; file left unchanged.",
    "ACC148": "A function that prepares the model it is handed with its own loaders and optimizer is called again when "
    "an error is caught (Milesial's U-Net retries `train_model` after `torch.cuda.OutOfMemoryError`): right when "
    "every process catches the error; an error of one process only (one GPU out of memory) leaves the others "
    "waiting in their next step: converted, reported.",
    "ACC149": "The data is split at random without a seed (`random_split(dataset, [n_train, n_val])` with no "
    "`generator=`, scikit-learn's `train_test_split` with no `random_state=`, and no seed of the generator they draw "
    "from): every process would split differently, so the processes would train on shards of different training "
    "sets and validate on samples others train on; file left unchanged.",
    "ACC150": "A `ReduceLROnPlateau` stepped on a value each process computes by the main process only, or where the "
    "Accelerator cannot be reached: every process must step it on the same value (ACC032 hands it the mean over the "
    "processes), or each would train with a learning rate of its own; file left unchanged.",
    "ACC151": "The training step runs inside `try:` in the loop, and an `except` goes on without raising (RetinaNet's "
    "`except Exception as e: print(e); continue`): an error one process meets alone makes it skip a step the others "
    "take, and their gradient all-reduces then pair different steps or wait: converted, reported.",
    "ACC152": "apex's mixed precision became the Accelerator's (ACC033), and part of it does not carry over: an "
    "`opt_level` other than O1 (Accelerate's fp16 is O1's autocast, with float32 weights), or a switch "
    "(`if args.fp16:`) not known where the Accelerator is created (the launch chooses then: `accelerate launch "
    "--mixed_precision fp16`): converted, reported.",
}


def code_key(code: str) -> tuple[str, int]:
    """Sort key of a code: by its number (``ACC129`` before ``ACC130``), not by where a table keeps it."""
    digits = len(code) - len(code.rstrip("0123456789"))
    return code[: len(code) - digits], int(code[len(code) - digits :] or 0)
