"""Reference PyTorch implementations of the model's reducing operations."""
