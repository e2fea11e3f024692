"""Authentication and authorization decisions, as pure code (the generic apiserver's rules)."""
