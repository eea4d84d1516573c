"""Verification: case matrix -> inputs -> kernel -> exact reference -> ulp error -> records."""
