"""Measured runs read back: profiler traces and nccl-tests output, against the course's bill."""
