"""Stage: heads. A draft head turns an LM hidden state `h` `[..., d]` into the flat parameters of a
compiled circuit over the next `n` tokens, and is trained with the NLL or the KL loss.

Takes: a compiled circuit (`circuitc.compile`) and the LM's hidden size; hands on: an `MTPHead`
(`theta = head(h)`, the layout `circuitc`'s programs read), saved and loaded as a head folder.
Modules: `head` (the parameterisations, save/load), `storage` (a head folder's files, checked),
`windows` (which targets a window scores), `nll_loss` (the fused, chunked windowed NLL), `kl_loss` (distillation against the LM's own conditionals).
Imported lazily (`from mtpc.heads import MTPHead`): its modules pull in torch, which the command line's
settings do not need (`constants`: the names and sizes they refer to).
"""

from ..lazy import lazy_getattr

_EXPORTS = {
    "MTPHead": "head", "FullHead": "head", "SharedHead": "head", "FactorisedHead": "head", "TiedHead": "head",
    "load_head": "head", "save_head": "head", "PARAMETERISATIONS": "constants",
    "mtp_loss": "nll_loss", "teacher_forced_accepted": "nll_loss", "valid_counts": "nll_loss",
    "kl_loss": "kl_loss", "lm_teacher": "kl_loss", "logits_teacher": "kl_loss",
    "target_validity": "windows", "window_targets": "windows",
}
__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
