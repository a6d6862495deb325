"""CST queries: the lowest layer. Questions about one LibCST tree and its metadata, with no
knowledge of a plan: what a name is called (``names``), what it refers to (``refs``), which
block holds a statement (``blocks``), what loops (``loops``), what trains (``training``),
what picks a device (``devices``), how to rebuild a tree (``trees``), a fast node index
(``walk``) and the raw finding record (``findings``). Nothing here imports from above."""
