"""What to run on the machine at hand: `costs` (a verify call's and a step's seconds, measured once and kept),
`auto_trees` (a tree's size from those costs and the head's recorded acceptance), `auto_decoding` (plain
decoding, a chain of some width or a tree, whichever is expected fastest)."""
