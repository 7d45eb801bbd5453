"""Framework instrumentation (PyTorch first), turned on lazily when the framework is imported."""
