"""Simulators that check the formulas independently: message-level collectives, pipeline schedules."""
