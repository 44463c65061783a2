"""The route modules: each holds its endpoints and its route table."""
