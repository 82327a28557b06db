"""The course as a static website (``python3 course.py book``); see build.py."""
