"""mtpc: multi-token prediction with probabilistic circuits, and lossless self-speculative decoding."""

from .decode import SpeculativeDecoder
from .head import MTPHead, load_head, save_head
