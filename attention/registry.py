"""name -> mechanism class: the same names everywhere (CLI flag, config, W&B tag, report row)."""

from __future__ import annotations

from attention.base import Mechanism

REGISTRY: dict[str, type[Mechanism]] = {}


def register(cls: type[Mechanism]) -> type[Mechanism]:
    if not cls.name or cls.__name__ != cls.name:
        raise TypeError(f"mechanism class {cls.__qualname__} must be named by its registry name")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"attention {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def build(spec: str | dict | Mechanism, **options) -> Mechanism:
    """A mechanism from a flag value: a name (``"coda"``), ``{"name": "coda", **options}``
    or an already built mechanism."""
    if isinstance(spec, Mechanism):
        if options:
            raise TypeError("options given beside an already built mechanism")
        return spec
    if isinstance(spec, dict):
        spec = dict(spec)
        name = spec.pop("name", None) or spec.pop("class_path", None)
        options = {**spec.pop("init_args", {}), **spec, **options}
        spec = name.rsplit(".", 1)[-1] if name else name
    if spec not in REGISTRY:
        raise ValueError(f"unknown attention {spec!r}; registered: {', '.join(REGISTRY)}")
    return REGISTRY[spec](**options)
