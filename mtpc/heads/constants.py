"""The heads stage's names and sizes that the settings of the stages above refer to (the command
line's choices and defaults); importable without torch."""

PARAMETERISATIONS = ("full", "shared", "factorised", "tied")  # how a head's input units get their weights
DEFAULT_ADAPTER_RANK = 16  # shared/factorised/tied: rank of the per-unit adapters
DEFAULT_FACTOR_RANK = 64  # factorised: rank of the per-position unembedding
DEFAULT_CHUNK_ELEMENTS = 1 << 22  # logits materialised at once by the chunked leaves (16 MiB in float32)
