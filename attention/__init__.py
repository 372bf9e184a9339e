"""attention: every mechanism of the four papers, selected by flag.

``REGISTRY`` maps a flag name to its mechanism class; ``build("coda", center_e=True)``
makes one.  The mechanism modules keep their names (``attention.coda`` is the module, its
flag class is ``attention.coda.coda``); importing this package registers every mechanism.
"""

from attention import (
    additive,
    coda,
    density,
    localness,
    luong,
    relative,
    softmax,
    structured,
    window,
)
from attention.base import (  # noqa: F401
    CONTEXTS,
    Alignment,
    AlignmentCore,
    DecoderCore,
    Mechanism,
    MultiHeadCore,
    UnsupportedContext,
)
from attention.multihead import MultiHeadAttention  # noqa: F401
from attention.registry import REGISTRY, build, register  # noqa: F401

for _module in (softmax, coda, window, localness, relative, additive, luong, density,
                structured):
    register(getattr(_module, _module.__name__.rsplit(".", 1)[1]))
