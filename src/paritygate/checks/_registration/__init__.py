"""Registrations (``POSITION``, ``CAUSES``) of checks whose module has no room left for them:
``paritygate.checks.<id>`` re-exports its own from ``_registration.<id>``."""
