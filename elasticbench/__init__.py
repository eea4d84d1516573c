"""elasticbench: numerics verification and roofline benchmarking for the softmax family."""

from .kernel_spec import KernelSpec, register_kernel
from .passes import PassModel
from .registry import list_kernels, load_kernel_file

__version__ = "0.1.0"

__all__ = ["KernelSpec", "PassModel", "__version__", "list_kernels", "load_kernel_file", "register_kernel"]
