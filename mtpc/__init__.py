"""mtpc: multi-token prediction with probabilistic circuits, and lossless self-speculative decoding."""

from .decode import SpeculativeDecoder
from .head import MTPHead, load_head, save_head
from .data import DataStats, Document, PackedDataset, load_documents, split_documents
from .loss import mtp_loss, teacher_forced_accepted
from .tinylm import TinyLMConfig, train_tiny_lm
from .tokenizer import ByteTokenizer
from .train import TrainConfig, train
