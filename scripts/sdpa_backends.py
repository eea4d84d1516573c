"""Which backend torch's scaled_dot_product_attention takes on this GPU, and each backend's
time at one shape (CUDA events, median of 20 after 3 warm-up calls):

    python scripts/sdpa_backends.py [--length 8192] [--dim 128] [--causal]

For reading a GPU attention table: `sdpa` there is whatever torch picks by default.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    q, k, v = (torch.randn(4, 16, args.length, args.dim, dtype=torch.bfloat16, device="cuda")
               for _ in range(3))

    def call():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal)

    print(f"B=4 H=16 L={args.length} D={args.dim} bf16 causal={args.causal}")
    print(f"  default: {median_ms(call):.3f} ms")
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                print(f"  {backend.name}: {median_ms(call):.3f} ms")
        except RuntimeError as e:
            print(f"  {backend.name}: not available ({str(e).splitlines()[0][:80]})")


if __name__ == "__main__":
    main()
