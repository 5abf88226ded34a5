"""Adapters that expose other libraries ' policies as paritygate factories."""
