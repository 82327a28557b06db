"""Classroom tooling: starter generation, grading, the student release (see grading/README.md)."""
