"""Plant named bugs in accelify, one at a time, and report which ones the test suite misses.

    python scripts/mutants.py             # every mutant
    python scripts/mutants.py --list      # names only
    python scripts/mutants.py NAME ...    # some of them

A habit, not a CI job: run it after changing a codemod or a test. Each mutant is a small,
plausible bug (the kind a real change could bring) written as an exact text replacement in one
file. For each: check the text is still there (else the mutant is *stale*: update it), write the
bug, run the tests that should catch it (``pytest -x``), put the file back, and record *killed*
(a test failed) or *survived*. The files are restored even on Ctrl-C; the script refuses to run
on a file with uncommitted changes, so a restore never loses work.

A survivor is a missing test: write the test that kills it, then run the mutant again.
Exit status: 0 when every mutant was killed.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAST = ["tests/", "--ignore=tests/test_e2e_scripts.py", "--ignore=tests/test_e2e_docs.py"]
E2E = ["tests/test_e2e_scripts.py"]
E2E_DIST = ["tests/test_e2e_distributed.py"]
NOTEBOOKS = ["tests/test_notebook.py", "tests/test_e2e_notebook.py"]
EVALUATION = ["tests/test_evaluation.py", "tests/test_e2e_evaluation.py"]


@dataclass(frozen=True)
class Mutant:
    name: str
    why: str  # what a user would get
    path: str
    old: str
    new: str
    tests: tuple[str, ...] = tuple(FAST)


MUTANTS = [
    # --- conversions that train wrongly with N processes (the end-to-end checks must see them)
    Mutant(
        "model-not-prepared", "each rank trains its own copy of the model (no DDP)",
        "codemods/prepare.py",
        "        self._names = self.plan.core()\n",
        "        self._names = [*self.plan.dataloaders, *self.plan.optimizers]\n",
        tests=tuple(E2E),
    ),
    Mutant(
        "loader-not-prepared", "every rank trains on the whole dataset",
        "codemods/prepare.py",
        "        self._names = self.plan.core()\n",
        "        self._names = [*self.plan.models, *self.plan.optimizers]\n",
        tests=tuple(E2E),
    ),
    Mutant(
        "backward-not-rewritten", "a plain backward: wrong under fp16, accumulation, DeepSpeed",
        "codemods/backward.py",
        '        if not m.matches(original_node.func, m.Attribute(attr=m.Name("backward"))):\n',
        "        if True:\n",
        tests=tuple(E2E) + ("-k", "test_converts"),
    ),
    Mutant(
        "print-on-every-rank", "every log line printed once per process",
        "codemods/main_process.py",
        '        return "print(" in code or "tqdm" in code or "trange" in code\n',
        "        return False\n",
        tests=tuple(E2E) + ("-k", "log_once"),
    ),
    Mutant(
        "metrics-not-gathered", "each process counts its own shard",
        "codemods/gather.py",
        "        gather = find_gather(self, node, self.plan)\n",
        "        gather = None\n",
        tests=tuple(E2E) + ("-k", "log_once"),
    ),
    Mutant(
        "save-on-every-rank", "every process writes the checkpoint",
        "codemods/saving.py",
        '        return "save(" in code\n',
        "        return False\n",
        tests=tuple(E2E) + ("-k", "save_once"),
    ),
    # --- the audit's survivors (issue 14)
    Mutant(
        "nested-batch-placement", "`model(chunk.to(device))` kept in a loop nested over a batch",
        "codemods/placement.py",
        "        elif self._is_derived(node.iter, self._current_derived()):\n",
        "        elif False:\n",
    ),
    Mutant(
        "list-metrics-not-gathered", "append/extend/add_batch/update no longer seen as metrics",
        "accelify/analyses/gathers.py",
        '_METRIC_CALLS = m.Expr(m.Call(func=m.Attribute(attr=m.Name("append") | m.Name("extend") | m.Name("add_batch")\n'
        '                                               | m.Name("update"))))\n',
        '_METRIC_CALLS = m.Expr(m.Call(func=m.Attribute(attr=m.Name("__no_metric__"))))\n',
    ),
    Mutant(
        "mixed-scheduler-per-batch", "a scheduler stepped per batch and per epoch is prepared",
        "accelify/analyses/schedulers.py",
        '    return "batch" if all(inside) else "epoch" if not any(inside) else "mixed"\n',
        '    return "batch" if any(inside) else "epoch"\n',
    ),
    # --- issue 8: what every process does, evaluation, reloads (second session)
    Mutant(
        "reloaded-model-left-on-cpu", "a model built again after training stays on the CPU while batches move",
        "codemods/placement.py",
        "                self._place.add(id(assign.value))\n",
        "                pass\n",
    ),
    Mutant(
        "load-before-the-save-is-written", "a file saved under `if acc > best:` is read before it is written",
        "codemods/saving.py",
        "            self._unsynced = True  # a later load waits for it\n",
        "            self._unsynced = False\n",
    ),
    Mutant(
        "whole-output-gathered", "`outputs`/`batch` gathered whole instead of the tensors the metric reads",
        "accelify/analyses/gathers.py",
        "        if not parts:\n",
        "        if True:\n",
    ),
    Mutant(
        "model-attribute-on-the-wrapper", "`model.decode` on the DDP wrapper: AttributeError with two processes",
        "codemods/unwrap.py",
        "        if not model_attribute(self, original_node, self.plan) or self.inside(original_node, self._plain):\n",
        "        if True:\n",
        tests=tuple(E2E) + ("-k", "vae_sampling"),
    ),
    Mutant(
        "sample-file-on-every-rank", "every process writes the sample files",
        "codemods/main_process_files.py",
        "            self._guard[id(original_node)] = accelerator  # wrapped with its neighbours in edit_body\n",
        "            pass\n",
        tests=tuple(E2E) + ("-k", "vae_sampling"),
    ),
    # --- issue 9: one analysis, one edit pass
    Mutant(
        "inert-helper-too-eager", "a helper that reads a name of the plan is not walked: its changes are lost",
        "accelify/core/composite.py",
        "            if name.value in self._relevant:  # type: ignore[attr-defined]\n                return False\n",
        "            if False:\n                return False\n",
        tests=("tests/test_composite.py",),
    ),
    Mutant(
        "replaced-statement-rewritten-again", "a statement a codemod replaced is rewritten again as the one it was",
        "accelify/core/composite.py",
        "            if type(result) is not kind or (statement and id(original_node) in shared.replaced):\n",
        "            if type(result) is not kind:\n",
        tests=("tests/test_fixtures.py",),
    ),
    Mutant(
        "stripped-device-reported", "a `.to(self.device)` that goes is also reported as turned into accelerator.device",
        "codemods/device.py",
        "        if placement is not None and placement.strips_use(original_node):  # type: ignore[attr-defined]\n"
        "            return updated_node  # `.to(self.device)` goes as a whole (ACC003)\n",
        "",
        tests=("tests/test_composite.py",),
    ),
    Mutant(
        "precheck-misses-backward", "a script that updates weights by hand is skipped without its ACC125",
        "accelify/core/precheck.py",
        "            if isinstance(func, ast.Attribute) and func.attr == \"backward\":\n                backward = True\n",
        "            if isinstance(func, ast.Attribute) and func.attr == \"backward\":\n                pass\n",
        tests=("tests/test_precheck.py",),
    ),
    Mutant(
        "import-removal-dropped", "imports the rewrite made unused are left behind",
        "accelify/core/pipeline.py",
        "        requests = [r for r in requests if read is None or _bound_name(r) not in read]\n",
        "        requests = []\n",
        tests=("tests/test_fixtures.py",),
    ),
    # --- README and docs/usage.md claims about the CLI
    Mutant(
        "cli-quiet-ignored", "-q still prints the summary",
        "accelify/app/cli.py", "    if not quiet:\n        run.say(summary", "    if True:\n        run.say(summary",
        tests=("tests/test_cli.py",),
    ),
    Mutant(
        "cli-line-length-ignored", "--line-length has no effect",
        "accelify/app/cli.py", "Options(line_length=line_length,", "Options(line_length=88,",
        tests=("tests/test_cli.py",),
    ),
    Mutant(
        "method-prepare-runs-twice", "a trainer's train() called twice prepares (wraps) the model twice",
        "accelify/analyses/prepare_point.py",
        "    if len(uses) != 1:\n",
        "    if len(uses) > 2:\n",
    ),
    Mutant(
        "early-sized-scheduler-unprepared", "a schedule sized before prepare decays N times too slowly",
        "accelify/analyses/schedulers.py",
        "            plan.sized_early.append(ref[1])\n",
        "            pass\n",
        tests=tuple(E2E),
    ),
    Mutant(
        "trainer-built-before-prepare", "a trainer handed the model before prepare keeps the unprepared one",
        "accelify/analyses/prepare_point.py",
        "            if call.func.value in facts.classes and handed:  # type: ignore[attr-defined]\n",
        "            if False:\n",
    ),
    Mutant(
        "handed-model-state-saved", "a callback saves the wrapper's module. keys on every process",
        "codemods/saving.py",
        "        handed = self._handed_model(call.args[0].value) if model is None else None\n",
        "        handed = None\n",
    ),
    Mutant(
        "gathered-slice-allowed", "time-major outputs gathered along time: another metric",
        "accelify/analyses/gathers.py",
        "            if sub.value.value in gathered and isinstance(first, cst.Slice) and (  # type: ignore[attr-defined]\n",
        "            if False and (  # type: ignore[attr-defined]\n",
    ),
    Mutant(
        "cli-no-color-ignored", "--no-color still colours the diff on a terminal",
        "accelify/app/cli.py",
        "    use_color = color if color is not None else sys.stdout.isatty()\n",
        "    use_color = color or sys.stdout.isatty()\n",
        tests=("tests/test_cli.py",),
    ),
    Mutant(
        "cli-no-diff-ignored", "--no-diff still prints the diff",
        "accelify/app/cli.py",
        "    show_diff = diff if diff is not None else not quiet_default\n",
        "    show_diff = not quiet_default\n",
        tests=("tests/test_cli.py",),
    ),
    Mutant(
        "cli-walks-tool-folders", "a directory run converts files under .git, venvs and build folders",
        "accelify/app/files.py",
        '            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))\n',
        "            dirs[:] = sorted(dirs)\n",
        tests=("tests/test_cli.py",),
    ),
    Mutant(
        "safety-check-ignored", "a rewrite that does not compile is written (no exit 123)",
        "accelify/core/pipeline.py",
        "    if output != source and not _still_parses(source, output):\n",
        "    if False:\n",
        tests=("tests/test_cli.py",),
    ),
    Mutant(
        "helper-save-barrier-everywhere", "a save helper called under `if acc > best:` waits for every process: a hang",
        "codemods/saving.py",
        "                or not self._every_process_calls(original_node)):\n",
        "                or False):\n",
        tests=("tests/test_fixtures.py",),
    ),
    Mutant(
        "module-device-kept", "batches placed on a module-level device in main() are left there: one device for all",
        "codemods/placement.py",
        "            if chosen_outside:\n",
        "            if False:\n",
        tests=("tests/test_fixtures.py",),
    ),
    Mutant(
        "precheck-skips-any-accelerator-text", "a training script with `Accelerator` in a string is skipped silently",
        "accelify/core/precheck.py",
        "        if line_of(line)[start:start + size] == _ACCELERATOR:\n",
        "        if True:\n",
        tests=("tests/test_precheck.py",),
    ),
    Mutant(
        "lazy-names-of-new-nodes", "a node written by a codemod gets qualified names (it should have none)",
        "accelify/core/metadata.py",
        "        elif self._index.holds(node):\n",
        "        elif True:\n",
        tests=("tests/test_composite.py",),
    ),
    Mutant(
        "scopes-without-contexts", "the scope analysis runs without the expression contexts: wrong names",
        "accelify/core/metadata.py",
        "    scopes.metadata = {ExpressionContextProvider: contexts._computed}\n",
        "    scopes.metadata = {ExpressionContextProvider: {}}\n",
        tests=("tests/test_composite.py",),
    ),
    Mutant(
        "github-error-no-position", "a syntax error annotation is not placed on its line",
        "accelify/output/report.py",
        '            position = _position(line, column, ",line={},col={}", ",line={}")\n            stream.write(f"::error',
        '            position = ""\n            stream.write(f"::error',
        tests=("tests/test_cli.py",),
    ),
    Mutant(
        "checkpoint-keeps-wrapper", "a model put whole into a checkpoint dict is pickled with its DDP wrapper",
        "codemods/saving.py",
        "        if id(original_node.value) not in self._whole_models:\n",
        "        if True:\n",
        tests=("tests/test_fixtures.py",),
    ),
    Mutant(
        "copy-on-every-process", "every process copies the best checkpoint at once",
        "accelify/queries/names.py",
        '    "shutil.copyfile", "shutil.copy", "shutil.copy2", "shutil.move",\n',
        "",
        tests=("tests/test_fixtures.py",),
    ),
    Mutant(
        "any-argument-attribute-stops", "`args.start_epoch = ...` after prepare is an internal error again",
        "accelify/queries/blocks.py",
        "            if reads is None:\n                return True\n",
        "            if True:\n                return True\n",
        tests=("tests/test_fixtures.py",),
    ),
    Mutant(
        "finding-on-the-module", "objects built in separate blocks at module level: an internal error",
        "accelify/analyses/facts.py",
        "        if isinstance(node, cst.Module):  # the whole file: its first line\n",
        "        if False:\n",
        tests=("tests/test_fixtures.py",),
    ),
    Mutant(
        "dict-of-loaders-is-data", "a loop over `dataloaders[phase]` is converted with a false note (ACC124)",
        "accelify/analyses/data.py",
        "    if isinstance(expr, cst.Subscript):  # `dataloaders[phase]`: a dict (or list) of DataLoaders\n",
        "    if False:\n",
        tests=("tests/test_fixtures.py",),
    ),
    Mutant(
        "links-out-followed", "a directory run converts a file of another tree reached through a link",
        "accelify/app/files.py",
        "    return os.path.commonpath([real, top]) != top\n",
        "    return False\n",
        tests=("tests/test_cli_jobs.py",),
    ),
    # --- hand-written distributed scripts (issue 10)
    Mutant(
        "eval-all-reduce-kept", "an evaluation's gathered counts are all-reduced too: counted N times",
        "accelify/analyses/distributed.py",
        "                dist.remove.add(id(statement))\n                dist.gathered.add(id(statement))\n",
        "                pass\n",
        tests=tuple(E2E_DIST),
    ),
    Mutant(
        "distributed-sampler-kept", "a DistributedSampler left in a prepared loader: the data sharded twice",
        "codemods/distributed.py",
        "        return id(value) in dist.samplers or ref_of(self, value) in dist.sampler_names\n",
        "        return False\n",
        tests=tuple(E2E_DIST),
    ),
    Mutant(
        "rank-test-unknown", "a save under `rank == 0` in a helper gets a barrier: a hang",
        "accelify/analyses/ranks.py",
        "    return main_process_test(visitor, test, plan) is not None\n",
        "    return False\n",
    ),
    Mutant(
        "spawn-rank-parameter-kept", "the worker still takes the rank spawn passed: a TypeError at start",
        "codemods/distributed.py",
        "            params = [p for p in updated_node.params.params if p.name.value not in gone]\n",
        "            params = list(updated_node.params.params)\n",
        tests=tuple(E2E_DIST),
    ),
    Mutant(
        "ddp-kwargs-dropped", "find_unused_parameters=True silently lost: DDP errors on unused parameters",
        "accelify/plan.py",
        "        if self.distributed is not None and self.distributed.ddp_kwargs:\n",
        "        if False:\n",
    ),
    Mutant(
        "factory-not-followed", "the DDP tutorial's load_train_objs() refused again (ACC107)",
        "accelify/analyses/factories.py",
        "    return redirected\n",
        "    return optimizers\n",
    ),
    Mutant(
        "launch-test-unknown", "a script with a single-process path too refused again",
        "accelify/analyses/ranks.py",
        "    if launched_test(facts, value, env_reads):\n        return \"use_distributed\"\n",
        "",
        tests=tuple(E2E_DIST),
    ),
    Mutant(
        "main-flag-unknown", "a save under `if master_process:` gets a barrier inside: a hang",
        "accelify/analyses/ranks.py",
        "    if isinstance(test, cst.Name) and _converted_main_flag(visitor, test):\n        return True\n",
        "",
    ),
    Mutant(
        "rank-zero-first-kept", "the barrier pair left as it is instead of main_process_first()",
        "accelify/analyses/distributed.py",
        "                        dist.first.append((id(stmt), id(body[j])))\n",
        "                        pass\n",
    ),
    Mutant(
        "no-sync-on-plain-model", "model.no_sync() kept: AttributeError in one process",
        "codemods/distributed.py",
        "            return self._no_sync(original_node, updated_node)\n",
        "            return updated_node\n",
    ),
    # --- notebooks
    Mutant(
        "notebook-masked-line-loses-indent", "a `!cmd` moved into a block by the rewrite comes back at its old indentation",
        "accelify/notebooks/convert.py",
        "        lines[where[0]] = indent + original[len(old_indent):] + line[len(body):]\n",
        "        lines[where[0]] = original + line[len(body):]\n",
        tests=tuple(NOTEBOOKS),
    ),
    Mutant(
        "notebook-finding-not-in-cell", "findings name lines of the hidden program, not the cell",
        "accelify/notebooks/convert.py",
        "    cell, line = _locate(parts, finding.line)\n    return replace(finding, line=line, cell=cell)\n",
        "    return finding\n",
        tests=tuple(NOTEBOOKS),
    ),
    Mutant(
        "notebook-converted-around-training-cell", "a training cell that does not parse is skipped and the rest converted",
        "accelify/notebooks/convert.py",
        "            if training:\n                refuse = True\n",
        "            if training:\n                refuse = False\n",
        tests=tuple(NOTEBOOKS),
    ),
    Mutant(
        "notebook-string-source-becomes-list", "a source written as a string is written back as a list",
        "accelify/notebooks/convert.py",
        '    if cell.form == "str":\n',
        "    if False:\n",
        tests=tuple(NOTEBOOKS),
    ),
    Mutant(
        "notebook-list-layout-lost", "rewritten sources laid out on one line: every line of the JSON diff changes",
        "accelify/notebooks/convert.py",
        "        opening = text[start + 1:first[0]]\n",
        '        opening = ""\n',
        tests=tuple(NOTEBOOKS),
    ),
    Mutant(
        "notebook-launcher-accelerator-left-outside", "the Accelerator created before notebook_launcher: it refuses to launch",
        "accelify/notebooks/launcher.py",
        "        chunks[home] = _cut(chunks[home], creation.lineno, creation.end_lineno or creation.lineno)\n",
        "        pass\n",
        tests=tuple(NOTEBOOKS),
    ),
    # --- evaluation and batch inference (issue 13)
    Mutant(
        "eval-model-wrapped-for-training", "an evaluated model prepared like a trained one (a DDP wrapper for nothing)",
        "codemods/prepare.py",
        '                f"{model} = {self.plan.accelerator}.prepare_model({model}, evaluation_mode=True)"))\n',
        '                f"{model} = {self.plan.accelerator}.prepare({model})"))\n',
        tests=tuple(EVALUATION),
    ),
    Mutant(
        "eval-list-not-gathered", "a split list's results stay one process's share",
        "codemods/split_inference.py",
        '                    out.append((self.parse_statement(f"{name} = gather_object({name})\\n"), None))\n',
        "                    pass\n",
        tests=tuple(EVALUATION),
    ),
    Mutant(
        "eval-split-counts-allowed", "a counter added up over one process's share of the list",
        "accelify/analyses/evaluation.py",
        "            if isinstance(small, cst.AugAssign):\n",
        "            if False:\n",
        tests=tuple(EVALUATION),
    ),
    Mutant(
        "eval-file-on-every-process", "every process writes the predictions file at once",
        "codemods/main_process_files.py",
        "        self._guard_with[id(statement)] = accelerator\n",
        "        pass\n",
        tests=tuple(EVALUATION),
    ),
    Mutant(
        "eval-per-batch-writes-allowed", "each process writes its shard's rows into the same file",
        "codemods/main_process_files.py",
        "        if writes and self._in_loader_loop(call):\n",
        "        if False:\n",
        tests=tuple(EVALUATION) + ("tests/test_fixtures.py",),
    ),
    Mutant(
        "state-dict-loaded-on-the-device", "torch.load onto cpu:0 (rejected) with several CPU processes",
        "codemods/device.py",
        "        return self._into_load_state_dict(load)\n",
        "        return False\n",
        tests=tuple(EVALUATION),
    ),
    # --- issue 24: what only a GPU or several processes show (the checks of accelify.runtime.checks)
    Mutant(
        "counters-left-on-host", "a CPU-only script's counters meet the device's outputs: a crash on a GPU",
        "codemods/__init__.py",
        "NumpyOnCpu, CountersOnDevice, HostInputs,",
        "NumpyOnCpu, HostInputs,",
        tests=("tests/test_e2e_scripts.py", "tests/test_counters.py"),
    ),
    Mutant(
        "host-input-not-moved", "a tensor computed on the host meets the prepared model: a crash on a GPU",
        "codemods/host_inputs.py",
        "                        self._place[id(arg.value)] = accelerator\n",
        "                        pass\n",
        tests=("tests/test_e2e_scripts.py", "tests/test_host_inputs.py"),
    ),
    Mutant(
        "progress-bar-on-every-rank", "a home-made progress bar drawn by every process",
        "codemods/__init__.py",
        "SplitInference, ConsoleHelpers, AddAccelerator,",
        "SplitInference, AddAccelerator,",
        tests=("tests/test_e2e_scripts.py", "tests/test_console_helpers.py"),
    ),
    Mutant(
        "batch-index-gathered", "the enumerate index gathered with the tensors: unpacking fails on 2 processes",
        "accelify/analyses/gathers.py",
        "derived = set(assigned_names(loop.target)) - enumerate_counter(loop)",
        "derived = set(assigned_names(loop.target))",
        tests=("tests/test_e2e_scripts.py",),
    ),
    Mutant(
        "iteration-scheduler-prepared", "a per-iteration schedule stepped N times per iteration",
        "accelify/analyses/schedulers.py",
        "        inside.append(loop is not None and not _iteration_bounded(facts, loop))",
        "        inside.append(loop is not None)",
        tests=("tests/test_e2e_shapes.py", "tests/test_scheduler_iterations.py"),
    ),
    Mutant(
        "unused-parameters-ignored", "DDP waits for a frozen part's gradients: fails at step 2",
        "accelify/analyses/plan.py",
        "    unused_parameters.decide(facts, plan)\n",
        "",
        tests=("tests/test_e2e_scripts.py", "tests/test_unused_parameters.py"),
    ),
    Mutant(
        "device-check-blind-to-mixing", "the emulation never sees a host tensor meet the device",
        "runtime/checks.py",
        "                elif host_hit is None and tensor.dim() > 0:",
        "                elif False:",
        tests=("tests/test_checks.py",),
    ),
    Mutant(
        "side-effects-never-judged", "files written by every process go unreported",
        "runtime/checks.py",
        "        if len(seen) < 2:\n            continue",
        "        if True:\n            continue",
        tests=("tests/test_checks.py", "tests/test_e2e_verify.py"),
    ),
    Mutant(
        "helper-reduces-gathered", "gathered counts all-reduced again by a helper: counted once per process",
        "accelify/analyses/distributed.py",
        "    return _reduced_by_helper(facts, plan)\n", "    return True\n",
        tests=("tests/test_research_ddp.py",),
    ),
    Mutant(
        "outputs-in-if-not-followed", "outputs made in an if/else not gathered: labels of all processes, outputs of one",
        "accelify/analyses/gathers.py",
        "            if isinstance(stmt, (cst.If, cst.Try)):", "            if False:",
        tests=("tests/test_gather.py",),
    ),
    Mutant(
        "if-on-gathered-taken", "a metric under an if that tests a gathered value converted",
        "accelify/analyses/gathers.py",
        "            return False  # `if out.shape[0] == 8:`", "            pass  # `if out.shape[0] == 8:`",
        tests=("tests/test_gather.py",),
    ),
    Mutant(
        "ddp-inputs-left-on-host", "a hand-made input DDP moved stays on the host beside the prepared model",
        "codemods/host_inputs.py",
        "        ddp_moved = self.plan.distributed is not None and any(", "        ddp_moved = False and any(",
        tests=("tests/test_research_ddp.py",),
    ),
    Mutant(
        "broadcast-refused", "dist.broadcast in a model refused (MoCo's batch shuffle)",
        "accelify/analyses/distributed.py",
        "        return _broadcast(dist, call, statement)\n", "        return call, 'broadcast', ''\n",
        tests=("tests/test_research_ddp.py",),
    ),
    Mutant(
        "acc109-first-gpu", "ACC109 claims the first GPU for a plain .cuda()",
        "codemods/placement.py",
        "    if value is None or text == \"cuda\":", "    if False:",
        tests=("tests/test_placement_helpers.py",),
    ),
    # sixteenth session
    Mutant(
        "iterator-not-moved", "an iterator made before prepare keeps wrapping the unprepared loader",
        "codemods/prepare.py",
        "        moved = [item for item in items if item[1] is not None and id(item[1]) in self.plan.after_prepare]",
        "        moved = []",
        tests=("tests/test_blocker_tails.py", "tests/test_unseeded_data.py", "tests/test_e2e_shapes.py"),
    ),
    Mutant(
        "helper-reduction-kept", "gathered counts reduced again by a helper, counted once per process",
        "accelify/analyses/distributed.py",
        "                    plan.distributed.remove.add(id(statement))\n                    plan.distributed.gathered.add(id(statement))\n",
        "",
        tests=("tests/test_research_ddp.py",),
    ),
    Mutant(
        "total-size-kept", "sampler.total_size read after the sampler is gone",
        "accelify/analyses/samplers.py",
        "    return f\"len({dataset.value})\" if isinstance(dataset, cst.Name) else None",
        "    return None",
        tests=("tests/test_research_ddp.py",),
    ),
    Mutant(
        "gpu-count-kept", "torch.cuda.device_count() divided by as the processes (0 on the CPU)",
        "codemods/distributed.py",
        "            return accelerator_attr(accelerator, \"num_processes\")\n        if self._fed_by_the_accelerator",
        "            return updated\n        if self._fed_by_the_accelerator",
        tests=("tests/test_research_ddp.py",),
    ),
    Mutant(
        "two-path-refused", "args.local_rank == -1 not read as a launch test",
        "accelify/analyses/ranks.py",
        "(cst.GreaterThan, \"-1\", True), (cst.Equal, \"-1\", False), (cst.LessThan, \"0\", False)):",
        "(cst.GreaterThan, \"-1\", True)):",
        tests=("tests/test_research_ddp.py", "tests/test_e2e_distributed.py"),
    ),
    Mutant(
        "process-loop-joins-kept", "the joins of processes the launcher now starts are left behind",
        "accelify/analyses/distributed.py",
        "    dist.joins.add(id(joined))\n", "",
        tests=("tests/test_research_ddp.py",),
    ),
    Mutant(
        "apex-converted", "an apex script converted: amp.scale_loss fails on the prepared optimizer",
        "accelify/analyses/mixed_precision.py",
        "            return False\n    return True\n\n\ndef decide(", "            return True\n    return True\n\n\ndef decide(",
        tests=("tests/test_research_ddp.py", "tests/test_fixtures.py"),
    ),
    Mutant(
        "ema-copy-blocks", "FixMatch's deep-copying EMA refused as keeping the unprepared model",
        "accelify/analyses/prepare_point.py",
        "    return bool(handed)\n", "    return False\n",
        tests=("tests/test_research_ddp.py",),
    ),
    Mutant(
        "counter-left-on-host", "a counter reduced by a dropped helper line stays on the host (fails on a GPU)",
        "codemods/counters.py",
        "            if isinstance(assign, cst.Assign) and self._goes(assign):",
        "            if False:",
        tests=("tests/test_e2e_distributed.py",),
    ),
    Mutant(
        "numpy-gathered", "NumPy arrays handed to gather_for_metrics (it fails on several processes)",
        "accelify/analyses/gathers.py",
        "    if inline is None and _on_the_host(rows[:at], set(gathered)):",
        "    if False:",
        tests=("tests/test_research_shapes.py",),
    ),
    Mutant(
        "type-as-on-host", "the device check takes type_as(placed) for a host tensor (ODE-Net failed verify)",
        "runtime/checks.py",
        "            if name == \"type_as\" and len(args) > 1",
        "            if False and len(args) > 1",
        tests=("tests/test_checks.py",),
    ),
]


def dirty(path: str) -> bool:
    return bool(subprocess.run(["git", "status", "--porcelain", "--", path], cwd=REPO, capture_output=True,
                               text=True).stdout.strip())


def run(mutant: Mutant) -> tuple[str, str]:
    target = REPO / mutant.path
    original = target.read_text(encoding="utf-8")
    count = original.count(mutant.old)
    if count != 1:
        return "stale", f"the text to replace occurs {count} times in {mutant.path}"
    if dirty(mutant.path):
        return "refused", f"{mutant.path} has uncommitted changes"
    try:
        target.write_text(original.replace(mutant.old, mutant.new), encoding="utf-8")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", *mutant.tests],
                              cwd=REPO, capture_output=True, text=True)
    finally:
        target.write_text(original, encoding="utf-8")
    if proc.returncode == 0:
        return "survived", ""
    failed = [line.split(" - ")[0] for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return "killed", (failed[0] if failed else proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        for mutant in MUTANTS:
            print(f"{mutant.name:28} {mutant.why}")
        return 0
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutants: {', '.join(sorted(unknown))}")
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    results = []
    for mutant in chosen:
        start = time.monotonic()
        status, detail = run(mutant)
        results.append(status)
        print(f"{status:9} {mutant.name:28} {time.monotonic() - start:6.1f}s  {detail}", flush=True)
    killed = results.count("killed")
    print(f"\n{killed}/{len(results)} killed" + "".join(
        f", {results.count(s)} {s}" for s in ("survived", "stale", "refused") if results.count(s)))
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
