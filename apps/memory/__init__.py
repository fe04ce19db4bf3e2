"""Core memory blocks, archival passages, and memory search."""
