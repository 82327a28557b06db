"""Formulas of the course: alpha-beta costs, the network model, the bill per axis, hardware and model presets."""
