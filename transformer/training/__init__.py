"""Training the Transformer (§5): token stores and batching by tokens, the loop, its schedule, loss,
checkpoints and resumption. The model itself (§3) and decoding are the package's top
(``transformer``); nothing there imports from here.

Importing this package runs none of its modules: a DVC stage depends on exactly the files it runs.
"""
