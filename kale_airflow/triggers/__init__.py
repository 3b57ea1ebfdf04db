"""Triggers (they must live in the installed package for the triggerer to import them)."""
