"""The six workspace tools: one module each, holding its argument model and its implementation."""
