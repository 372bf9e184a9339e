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


def context_table() -> str:
    """Markdown table: each registered mechanism x the three contexts, "yes" or the reason
    the mechanism gives when it is asked for there (README's mechanism table)."""
    from attention.base import CONTEXTS, UnsupportedContext

    probes = {"multihead": lambda m: m.multihead(d_model=8, n_heads=2),
              "alignment": lambda m: m.alignment(dim=8),
              "decoder": lambda m: m.decoder(query_dim=8, memory_dim=8)}
    rows = ["| mechanism | " + " | ".join(CONTEXTS) + " |", "|---" * (len(CONTEXTS) + 1) + "|"]
    for name, cls in REGISTRY.items():
        cells = []
        for context in CONTEXTS:
            try:
                probes[context](cls())
                cells.append("yes")
            except UnsupportedContext as err:
                reason = str(err).split(" attention: ", 1)[-1].split(". Mechanisms that can")[0]
                cells.append(f"no: {reason}")
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)
