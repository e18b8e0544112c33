"""Process-level helpers under every layer: threads, the garbage collector, memory limits."""
