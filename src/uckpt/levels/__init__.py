"""Levels above a single node's storage: redundancy across nodes (partner copies, XOR
parity over groups of nodes), encoded and rebuilt here, moved over the communicator.

Framework-free and light: importing it imports no module that talks to other ranks.
"""
