"""The speculative cycle: `decoder` (the one speculative loop and its compiled cycle), `verify` (the model's
call over a cycle's windows, into preallocated caches), `acceptance` (the speculative-sampling rule), `data`
(a cycle's named data: what a step returns, the one tensor the host reads, each row's host view), `host`
(the one device-to-host read a cycle makes)."""
