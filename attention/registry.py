"""name -> mechanism class: the same names everywhere (CLI flag, config, W&B tag, report row)."""

from __future__ import annotations

import difflib
import inspect

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
        raise ValueError(unknown_attention(spec))
    known = options_of(spec)
    if known is not None:
        for option in options:
            if option not in known:
                raise TypeError(unknown_option(spec, option))
    return REGISTRY[spec](**options)


def supporting(context: str) -> list[str]:
    """The registered mechanisms that serve ``context`` (one of attention.base.CONTEXTS), in
    registry order."""
    return [name for name, cls in REGISTRY.items() if cls().supports(context)]


def options_of(name: str) -> list[str] | None:
    """The options (constructor arguments) of mechanism ``name``; None when it takes any."""
    params = inspect.signature(REGISTRY[name]).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def _did_you_mean(word: str, candidates) -> str:
    close = difflib.get_close_matches(str(word), list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_attention(spec) -> str:
    """The one-line error for a name that is no registered mechanism."""
    return (f"unknown attention {spec!r}{_did_you_mean(spec, REGISTRY)}; "
            f"registered: {', '.join(REGISTRY)}")


def unknown_option(name: str, option: str) -> str:
    """The one-line error for an option mechanism ``name`` does not take."""
    known = options_of(name) or []
    if not known:
        return f"{name} has no option {option!r}: {name} takes no options"
    return (f"{name} has no option {option!r}{_did_you_mean(option, known)}; "
            f"options of {name}: {', '.join(known)}")


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
