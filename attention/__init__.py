"""attention: every mechanism of the four papers, selected by flag.

``REGISTRY`` maps a flag name to its mechanism class; ``build("coda", center_e=True)``
makes one.  Each mechanism module registers itself on import.
"""

from attention.base import (  # noqa: F401
    CONTEXTS,
    Alignment,
    AlignmentCore,
    DecoderCore,
    Mechanism,
    MultiHeadCore,
    UnsupportedContext,
)
from attention.coda import coda
from attention.multihead import MultiHeadAttention  # noqa: F401
from attention.registry import REGISTRY, build, register  # noqa: F401
from attention.softmax import softmax

for _mechanism in (softmax, coda):
    register(_mechanism)
