"""Rewrite rules as egglog files (package data)."""
