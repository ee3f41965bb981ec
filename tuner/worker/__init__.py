"""The worker side: everything that imports TensorFlow lives under this package."""
