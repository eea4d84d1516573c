"""elasticbench: numerics verification and roofline benchmarking for the softmax family."""

from .passes import PassModel
from .registry import KernelSpec, list_kernels, load_kernel_file, register_kernel

__version__ = "0.1.0"

__all__ = ["KernelSpec", "PassModel", "__version__", "list_kernels", "load_kernel_file", "register_kernel"]
