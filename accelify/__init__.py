"""accelify: migrate plain PyTorch training scripts to Hugging Face Accelerate.

The converter is pure source-to-source work on LibCST trees: importing this
package (or running the CLI) never imports torch or accelerate.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
