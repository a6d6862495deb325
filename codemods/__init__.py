"""The codemods, one per file, and the order they run in.

Installed as ``accelify.codemods``; inside the repository the folder is ``codemods/``.
"""

from __future__ import annotations

from accelify.codemods.data_parallel import DataParallel
from accelify.codemods.gather import GatherForMetrics
from accelify.codemods.main_process_files import MainProcessFiles
from accelify.codemods.unwrap import UnwrapModelAttributes

from .accelerator import AddAccelerator
from .accelerator_param import AcceleratorParameter
from .accumulation import GradientAccumulation
from .apex_amp import ApexAmp
from .backward import Backward
from .base import AccelifyCodemod
from .clipping import Clipping
from .console_helpers import ConsoleHelpers
from .counters import CountersOnDevice
from .device import RemoveDevice
from .distributed import Distributed
from .host_batch_parts import HostBatchParts
from .host_inputs import HostInputs
from .launch import SpawnLaunch
from .loading import Loading
from .main_process import MainProcessOutput
from .mixed_precision import MixedPrecision
from .module_device import ModuleDevice
from .numpy_cpu import NumpyOnCpu
from .optimizer_step import OptimizerStepClosure
from .placement import RemovePlacement
from .plateau_metric import PlateauMetric
from .prepare import Prepare
from .rank_helpers import RankHelpers
from .saving import Saving
from .seeding import Seeding
from .setup_helper import SetUpHelper
from .split_inference import SplitInference
from .synced_skip import SyncedSkip
from .visible_devices import LauncherDevices
from .world_size import ProcessGroupAttributes

# The order matters:
# 1. placement first: it must still see `.to(device)` to know what the device var is used for;
#    DataParallel right after, so `model = nn.DataParallel(model).to(device)` loses both; the
#    distributed plumbing next (a rank in a placement is gone with the placement);
# 2. device next: whatever use of the device survived becomes `accelerator.device`, then the
#    assignment goes; a helper with no device parameter to carry the accelerator gets one;
# 3. prepare once placement is gone, so `model = model.to(device)` no longer counts as a binding;
# 4. gradient accumulation before mixed precision and backward: it must still see the loss
#    divided right before its `.backward()` (or `scaler.scale(loss).backward()`);
#    mixed precision before backward: `scaler.scale(loss).backward()` becomes `loss.backward()`,
#    which backward then routes through the accelerator; clipping, saving and metric gathering
#    are independent (gathering after device, whose renamed parameter it may use); loading after
#    prepare, whose statement it compares with, and after saving, whose rewrite it must see;
#    model attributes (unwrap_model) after prepare, whose statement marks where the model is wrapped;
#    file writes put under `is_main_process` before the Accelerator is placed (they use it);
# 5. the Accelerator near the end: it goes before the first statement that uses it, which the
#    earlier passes create;
# 6. main-process output after it: a `print` before the Accelerator exists must stay a print.
# RankHelpers rewrites the bodies of the script's own rank helpers, which the distributed pass leaves (guarded).
# ModuleDevice rewrites a device chosen at the module's top, whose uses the other passes leave as they are.
# LauncherDevices removes the script's CUDA_VISIBLE_DEVICES before the device codemod replaces the
# device next to it; CountersOnDevice, HostInputs, ConsoleHelpers and SyncedSkip name the Accelerator, so they come
# before it.
# The import visitors run after all of them (in the pipeline). SpawnLaunch, SetUpHelper and ProcessGroupAttributes
# are listed for their codes and docs: they run before the analysis (`accelify.core.pipeline`), never in the one
# traversal.
CODEMODS: tuple[type[AccelifyCodemod], ...] = (
    SpawnLaunch, SetUpHelper, ProcessGroupAttributes,  # (before the analysis, on the file as written: never in the
    # traversal)
    RemovePlacement, DataParallel, Distributed, LauncherDevices, RemoveDevice, ModuleDevice, RankHelpers, AcceleratorParameter,
    Prepare,
    OptimizerStepClosure, GradientAccumulation, MixedPrecision, ApexAmp, Backward, Clipping, Saving, Loading, UnwrapModelAttributes,
    GatherForMetrics, PlateauMetric, MainProcessFiles, SyncedSkip, Seeding, NumpyOnCpu, CountersOnDevice, HostInputs, HostBatchParts, SplitInference, ConsoleHelpers,
    AddAccelerator,
    MainProcessOutput,
)


def gather_codemods() -> tuple[type[AccelifyCodemod], ...]:
    return CODEMODS


def by_code() -> dict[str, type[AccelifyCodemod]]:
    return {cls.CODE: cls for cls in sorted(CODEMODS, key=lambda c: c.CODE)}


__all__ = ["AccelifyCodemod", "CODEMODS", "by_code", "gather_codemods"]
