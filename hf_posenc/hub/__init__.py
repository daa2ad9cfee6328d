"""The Hub: pushing a patched model, its card, reading what a repo holds, and the Hub's errors."""
