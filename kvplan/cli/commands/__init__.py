"""CLI commands beyond the core ones; each module defines ``register(app)`` and imports heavy
dependencies (pydantic, torch, matplotlib) inside its command function, never at import time."""
