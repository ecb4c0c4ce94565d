"""Stage: training. Local files -> packed batches -> a trained head (`mtpc train`), a tiny byte LM
(`mtpc tiny-lm`), or the LM's own continuations as head-training data (`mtpc distill-data`).

Takes: a model folder and a data source (files, folders, globs, JSONL); hands on: head folders and
model folders on disk (`mtpc.lm.loading` and `mtpc.heads` read them back).
Modules: `config` (the three commands' settings, torch-free), `data` (documents, split, packing,
epoch order), `loop` (the one training loop both trainers run), `trainer` (`mtpc train`; its setup,
validation and checkpoint in `trainer_setup`, `trainer_validation`, `trainer_checkpoints`), `tiny_lm`
(`mtpc tiny-lm`; `tiny_lm_setup`, `tiny_lm_model`, `tiny_lm_checkpoints`), `distill`
(`mtpc distill-data`), `features` (`mtpc features`: the LM's cached hidden states for
`mtpc train --features`), and their shared pieces: `schedule` (budgets, learning rate), `precision`,
`progress`, `distributed`, `checkpoints` (checkpoint files, RNG state, the training log).
Imported lazily (`from mtpc.training import train`): its modules pull in torch and transformers
(all but `config`).
"""

from ..lazy import lazy_getattr

_EXPORTS = {
    "DataStats": "data", "Document": "data", "PackedDataset": "data", "load_documents": "data",
    "split_documents": "data", "TrainConfig": "config", "train": "trainer", "TinyLMConfig": "config",
    "train_tiny_lm": "tiny_lm", "DistillConfig": "config", "distill_data": "distill",
    "FeaturesConfig": "config", "write_features": "features", "FeatureSet": "features",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
