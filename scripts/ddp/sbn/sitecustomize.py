"""For *converted* DDP real scripts on the CPU (scripts/ddp/run.py), two stand-ins for what a GPU has and this
machine does not, neither of which the conversion is about:

- SyncBatchNorm has no CPU kernels: ``convert_sync_batchnorm`` leaves the model's batch norms per process;
- ``torch.cuda.synchronize()`` (DINO's and WZ's timing code, kept by the conversion as the author wrote it:
  right on every GPU) waits for nothing where there is no CUDA device.

Nothing else changes: the device check of ``accelify.runtime.trace`` emulates the accelerator's device."""

import torch

torch.nn.SyncBatchNorm.convert_sync_batchnorm = classmethod(lambda cls, module, process_group=None: module)
if not torch.cuda.is_available():
    torch.cuda.synchronize = lambda *args, **kwargs: None
