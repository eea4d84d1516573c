"""Named, seeded input generators: the adversarial inputs of docs/inputs.md."""

from elasticbench.harness.inputs.generators import GENERATORS, Generator, generate, get_generator

__all__ = ["GENERATORS", "Generator", "generate", "get_generator"]
