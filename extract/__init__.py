"""GPU hardware profiles and calibration (package data)."""
