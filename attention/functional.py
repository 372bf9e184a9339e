"""The functional layer: each mechanism's equation on plain tensors (no parameters).

The implementations live beside their mechanisms; this module gives them the names of the
papers' public API.
"""

from attention.coda import l1_distance  # noqa: F401
from attention.coda import quasi_attention as coda  # noqa: F401
from attention.density import density_context  # noqa: F401
from attention.masking import masked_mean, masked_softmax  # noqa: F401
from attention.window import window_mask  # noqa: F401
