"""Stage: heads. A draft head turns an LM hidden state `h` `[..., d]` into the flat parameters of a
compiled circuit over the next `n` tokens, and is trained with the NLL or the KL loss.

Takes: a compiled circuit (`circuitc.compile`) and the LM's hidden size; hands on: an `MTPHead`
(`theta = head(h)`, the layout `circuitc`'s programs read), saved and loaded as a head folder.
Modules: `head` (the parameterisations, save/load), `windows` (which targets a window scores),
`nll_loss` (the fused, chunked windowed NLL), `kl_loss` (distillation against the LM's own conditionals).
"""

from .head import PARAMETERISATIONS, FactorisedHead, FullHead, MTPHead, SharedHead, TiedHead, load_head, save_head
from .kl_loss import kl_loss, lm_teacher, logits_teacher
from .nll_loss import mtp_loss, teacher_forced_accepted, valid_counts
from .windows import target_validity, window_targets

__all__ = ["MTPHead", "FullHead", "SharedHead", "FactorisedHead", "TiedHead", "PARAMETERISATIONS", "load_head", "save_head",
           "mtp_loss", "teacher_forced_accepted", "valid_counts", "kl_loss", "lm_teacher", "logits_teacher",
           "target_validity", "window_targets"]
