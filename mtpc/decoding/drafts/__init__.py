"""What a cycle verifies: `drafting` (the circuit's windows and their verify widths), `trees` (a tree of
drafts: its budget, the circuit's choice of nodes), `proposers` (what drafts a window: the circuit, prompt
lookup, any host proposer), `proposals` (prompt lookup's matching)."""
