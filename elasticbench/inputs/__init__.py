"""Named, seeded input generators: the adversarial inputs of DESIGN.md section 5."""

from .generators import GENERATORS, Generator, generate, get_generator

__all__ = ["GENERATORS", "Generator", "generate", "get_generator"]
