"""Sensors."""
