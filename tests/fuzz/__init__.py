"""Property-based fuzzing of the data plane (hypothesis)."""
