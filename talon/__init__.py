"""Talon: tree speculative decoding you can see and tune."""
