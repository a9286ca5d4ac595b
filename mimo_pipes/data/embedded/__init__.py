"""The built-in data, built offline from code: the synthetic dataset, the embedded processor and tiny processor
folders of each family."""
