"""Long-completion collapse benchmark (docstring to come)."""
